// The attention args (CalcMeta) of every rank and stage.
#include <algorithm>
#include <limits>
#include <memory>
#include <span>
#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/slice_clip.hpp"
#include "plan/buffer_map.hpp"
#include "plan/builder_internal.hpp"

namespace cpsched::plan_detail {

namespace {

struct ArgSink {
  std::vector<BufferMap::Run> qr, kr;
  std::vector<Slice> sub;

  void push(std::vector<AttnArg>& out, const Slice& s, const BufferMap& qm, Token dq, const BufferMap& km, Token dk,
            int group) {
    out.push_back(AttnArg{{s.q.begin + dq, s.q.end + dq}, {s.k.begin + dk, s.k.end + dk}, s.type, qm.buf,
                          km.buf, group});
  }

  // A tight slice (global coords) as args in buffer coords; pieces that
  // straddle a discontinuity of either buffer are cut there.
  void emit(const Slice& s, const BufferMap& qm, const BufferMap& km, int group, std::vector<AttnArg>& out) {
    if (!qm.runs(s.q, qr) || !km.runs(s.k, kr))
      throw Error(fmt::format("plan builder (internal): rows [{}, {}) x cols [{}, {}) are not all in the buffers",
                              s.q.begin, s.q.end, s.k.begin, s.k.end));
    if (qr.size() == 1 && kr.size() == 1) {
      push(out, s, qm, qr[0].shift, km, kr[0].shift, group);
      return;
    }
    const Band b = band_of(s);
    for (const BufferMap::Run& q : qr)
      for (const BufferMap::Run& k : kr) {
        sub.clear();
        band_to_slices(clip(b, q.global, k.global), sub);
        for (const Slice& x : sub) push(out, x, qm, q.shift, km, k.shift, group);
      }
  }
};

}  // namespace

void build_calc(const Assignment& a, const Transfers& tr, const std::vector<int>& stage, const XferLayout& where,
                int stages, std::vector<PassPlan*>& pass, bool index_rows, bool area_only, Rank only,
                BufferRecycler* buffers, bool local_tail) {
  const TaskGrid& g = *a.grid;
  const Sharding& sh = g.sharding();
  const bool flat = g.flattened();
  auto mine = [&](std::size_t r) { return only < 0 || static_cast<Rank>(r) == only; };
  for (std::size_t r = 0; r < pass.size(); ++r) {
    if (!mine(r)) continue;
    PassPlan* p = pass[r];
    p->calc.local_attn_args.clear();
    p->calc.indices = {};
    p->calc.deferred_index_entries = 0;
    p->calc.remote_attn_args.assign(static_cast<std::size_t>(stages), {});
  }
  std::vector<int> last_q(static_cast<std::size_t>(stages) + 1, 0), last_k = last_q;
  ArgSink sink;
  std::vector<Slice> tight;
  const bool index = g.index_cells();
  const BufferMaps maps{sh, where};

  std::vector<Token> stage_area(static_cast<std::size_t>(stages) + 1);
  for (std::size_t d = 0; d + 1 < tr.rank_begin.size(); ++d) {
    CalcMeta& calc = pass[d]->calc;
    if (area_only) std::fill(stage_area.begin(), stage_area.end(), 0);
    RankIndexArgs index_args;
    if (index && !area_only && mine(d)) {
      if (g.problem().index_row_runs) {  // the executor writes the rows (row runs: no rows here)
        index_args = rank_deferred_index_args(a, tr, where, d);
        calc.deferred_index_entries = index_args.deferred_entries;
      } else {
        index_args = rank_index_args(a, tr, where, d, index_rows, buffers);
        calc.indices = std::move(index_args.pool);
      }
    }
    // Rank-only transfers know the other ranks' tasks only by remote_q and
    // remote_k (below).
    const bool skip = tr.only >= 0 && static_cast<Rank>(d) != tr.only;
    // The local tail: the rank's local tasks from half its local load on.
    std::int64_t local_load = 0, local_before = 0;
    if (local_tail && !skip)
      for (std::size_t i = tr.rank_begin[d]; i < tr.rank_begin[d + 1]; ++i)
        if (const PlacedTask pt = placed_task(g, tr, i); pt.xq < 0 && pt.xk < 0) local_load += g.load(pt.t);
    for (std::size_t i = skip ? tr.rank_begin[d + 1] : tr.rank_begin[d]; i < tr.rank_begin[d + 1]; ++i) {
      const auto [t, cell, grp, xq, xk] = placed_task(g, tr, i);
      const Cell& c = *cell;
      const int sq = xq < 0 ? 0 : stage[static_cast<std::size_t>(xq)];
      const int sk = xk < 0 ? 0 : stage[static_cast<std::size_t>(xk)];
      int st = std::max(sq, sk);
      if (local_tail && st == 0) {
        if (2 * local_before >= local_load) st = stages;
        local_before += g.load(t);
      }
      if (xq >= 0) last_q[static_cast<std::size_t>(sq)] = std::max(last_q[static_cast<std::size_t>(sq)], st);
      if (xk >= 0) last_k[static_cast<std::size_t>(sk)] = std::max(last_k[static_cast<std::size_t>(sk)], st);
      if (!mine(d)) continue;
      if (area_only) {
        stage_area[static_cast<std::size_t>(st)] += g.area(t);
        continue;
      }
      std::vector<AttnArg>& out = st == 0 ? calc.local_attn_args : calc.remote_attn_args[static_cast<std::size_t>(st - 1)];
      if (index) {
        const auto& args = index_args.args[i - tr.rank_begin[d]];
        out.insert(out.end(), args.begin(), args.end());
        continue;
      }
      const BufferMap qm = maps.of(xq, c.qblock), km = maps.of(xk, c.kblock);
      const Range qb = sh.blocks[static_cast<std::size_t>(c.qblock)];
      const Range kb = sh.blocks[static_cast<std::size_t>(c.kblock)];
      for (const Slice& s : c.pieces) {
        tight.clear();
        band_to_slices(clip(band_of(s), qb, kb), tight);
        for (const Slice& x : tight) sink.emit(x, qm, km, grp, out);
      }
    }
    if (!mine(d)) continue;
    if (area_only)
      for (int st = 0; st <= stages; ++st) {
        const Token area = stage_area[static_cast<std::size_t>(st)];
        if (area == 0) continue;
        const BufferId buf = st == 0 ? BufferId::local : BufferId::remote;
        (st == 0 ? calc.local_attn_args : calc.remote_attn_args[static_cast<std::size_t>(st - 1)])
            .push_back(AttnArg{{0, 1}, {0, 1}, MaskType::full, buf, buf, flat ? 0 : -1, 1, 0, area});
      }
  }
  if (tr.only >= 0) {
    // One stage (Transfers::only): every remote task runs in stage 1.
    if (stages != 1) throw Error("plan builder (internal): rank-only transfers make one-stage plans only");
    last_q[1] = tr.remote_q ? 1 : 0;
    last_k[1] = tr.remote_k ? 1 : 0;
  }
  for (std::size_t r = 0; r < pass.size(); ++r) {
    if (!mine(r)) continue;
    PassPlan* p = pass[r];
    for (std::size_t s = 0; s < p->comm.stages.size(); ++s) {
      p->comm.stages[s].qo_reduce_after = last_q[s + 1];
      p->comm.stages[s].kv_reduce_after = last_k[s + 1];
    }
  }
}

}  // namespace cpsched::plan_detail
