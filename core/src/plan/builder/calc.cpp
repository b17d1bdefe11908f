// The attention args (CalcMeta) of every rank and stage.
#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/slice_clip.hpp"
#include "cpsched/hardware/task_kernel.hpp"
#include "plan/builder/buffer_map.hpp"
#include "plan/builder/internal.hpp"

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

namespace {

// The stage of each task of rank d, in Transfers::task_order: the later of
// its rows' stages (0 when both are local); with the local tail, the local
// tasks past the first half of the rank's local load run in the tail (stage
// `stages`). f(i, task, st, sq, sk), sq and sk the stages of its rows.
// Rank-only transfers (Transfers::only) hold no tasks of the other ranks.
template <class F>
void for_each_staged_task(const TaskGrid& g, const Transfers& tr, const std::vector<int>& stage, int stages,
                          bool local_tail, std::size_t d, F&& f) {
  if (tr.only >= 0 && static_cast<Rank>(d) != tr.only) return;
  std::int64_t local_load = 0, local_before = 0;
  if (local_tail)
    for (std::size_t i = tr.rank_begin[d]; i < tr.rank_begin[d + 1]; ++i)
      if (const PlacedTask pt = placed_task(g, tr, i); pt.xq < 0 && pt.xk < 0) local_load += g.load(pt.t);
  for (std::size_t i = tr.rank_begin[d]; i < tr.rank_begin[d + 1]; ++i) {
    const PlacedTask pt = placed_task(g, tr, i);
    const int sq = pt.xq < 0 ? 0 : stage[static_cast<std::size_t>(pt.xq)];
    const int sk = pt.xk < 0 ? 0 : stage[static_cast<std::size_t>(pt.xk)];
    int st = std::max(sq, sk);
    if (local_tail && st == 0) {
      if (2 * local_before >= local_load) st = stages;
      local_before += g.load(pt.t);
    }
    f(i, pt, st, sq, sk);
  }
}

// Records that a task of stage st reads the rows of its QO (KV) xfer, sent in
// stage sq (sk): last[s] is the last stage reading rows received in stage s.
struct LastReaders {
  std::vector<int> q, k;
  explicit LastReaders(int stages) : q(static_cast<std::size_t>(stages) + 1, 0), k(q) {}
  void read(const PlacedTask& pt, int st, int sq, int sk) {
    if (pt.xq >= 0) q[static_cast<std::size_t>(sq)] = std::max(q[static_cast<std::size_t>(sq)], st);
    if (pt.xk >= 0) k[static_cast<std::size_t>(sk)] = std::max(k[static_cast<std::size_t>(sk)], st);
  }
  // One stage (Transfers::only): every remote task runs in stage 1.
  void rank_only(const Transfers& tr, int stages) {
    if (stages != 1) throw Error("plan builder (internal): rank-only transfers make one-stage plans only");
    q[1] = tr.remote_q ? 1 : 0;
    k[1] = tr.remote_k ? 1 : 0;
  }
};

}  // namespace

void build_calc(const Assignment& a, const Transfers& tr, const std::vector<int>& stage, const XferLayout& where,
                int stages, std::vector<PassPlan*>& pass, bool index_rows, Rank only, BufferRecycler* buffers,
                bool local_tail) {
  const TaskGrid& g = *a.grid;
  const Sharding& sh = g.sharding();
  auto mine = [&](std::size_t r) { return only < 0 || static_cast<Rank>(r) == only; };
  for (std::size_t r = 0; r < pass.size(); ++r) {
    if (!mine(r)) continue;
    PassPlan* p = pass[r];
    p->calc.local_attn_args.clear();
    p->calc.indices = {};
    p->calc.deferred_index_entries = 0;
    p->calc.remote_attn_args.assign(static_cast<std::size_t>(stages), {});
  }
  LastReaders last(stages);
  ArgSink sink;
  std::vector<Slice> tight;
  const bool index = g.index_cells();
  const BufferMaps maps{sh, where};

  for (std::size_t d = 0; d + 1 < tr.rank_begin.size(); ++d) {
    CalcMeta& calc = pass[d]->calc;
    RankIndexArgs index_args;
    if (index && mine(d)) {
      if (g.problem().index_row_runs) {  // the executor writes the rows (row runs: no rows here)
        index_args = rank_deferred_index_args(a, tr, where, d);
        calc.deferred_index_entries = index_args.deferred_entries;
      } else {
        index_args = rank_index_args(a, tr, where, d, index_rows, buffers);
        calc.indices = std::move(index_args.pool);
      }
    }
    for_each_staged_task(g, tr, stage, stages, local_tail, d, [&](std::size_t i, const PlacedTask& pt, int st, int sq, int sk) {
      last.read(pt, st, sq, sk);
      if (!mine(d)) return;
      std::vector<AttnArg>& out = st == 0 ? calc.local_attn_args : calc.remote_attn_args[static_cast<std::size_t>(st - 1)];
      if (index) {
        const auto& args = index_args.args[i - tr.rank_begin[d]];
        out.insert(out.end(), args.begin(), args.end());
        return;
      }
      const Cell& c = *pt.cell;
      const BufferMap qm = maps.of(pt.xq, c.qblock), km = maps.of(pt.xk, c.kblock);
      const Range qb = sh.blocks[static_cast<std::size_t>(c.qblock)];
      const Range kb = sh.blocks[static_cast<std::size_t>(c.kblock)];
      for (const Slice& s : c.pieces) {
        tight.clear();
        band_to_slices(clip(band_of(s), qb, kb), tight);
        for (const Slice& x : tight) sink.emit(x, qm, km, pt.group, out);
      }
    });
  }
  if (tr.only >= 0) last.rank_only(tr, stages);
  for (std::size_t r = 0; r < pass.size(); ++r) {
    if (!mine(r)) continue;
    PassPlan* p = pass[r];
    for (std::size_t s = 0; s < p->comm.stages.size(); ++s) {
      p->comm.stages[s].qo_reduce_after = last.q[s + 1];
      p->comm.stages[s].kv_reduce_after = last.k[s + 1];
    }
  }
}

namespace {

// The kernel args build_calc makes of a placed range task whose rows come
// through `maps`: its tight slices, cut where a buffer's runs break
// (ArgSink::emit's pieces).
void placed_kernel_args(const TaskGrid& g, const PlacedTask& pt, const BufferMaps& maps, std::vector<KernelArg>& out) {
  out.clear();
  const Cell& c = *pt.cell;
  const Sharding& sh = g.sharding();
  const BufferMap qm = maps.of(pt.xq, c.qblock), km = maps.of(pt.xk, c.kblock);
  const Range qb = sh.blocks[static_cast<std::size_t>(c.qblock)];
  const Range kb = sh.blocks[static_cast<std::size_t>(c.kblock)];
  thread_local std::vector<Slice> tight, sub;
  thread_local std::vector<BufferMap::Run> qr, kr;
  auto add = [&](const Slice& x) { out.push_back({kernel_form(x.type), x.q.size(), x.k.size(), slice_area(x), 0}); };
  for (const Slice& s : c.pieces) {
    tight.clear();
    band_to_slices(clip(band_of(s), qb, kb), tight);
    for (const Slice& x : tight) {
      if (!qm.runs(x.q, qr) || !km.runs(x.k, kr))
        throw Error(fmt::format("plan builder (internal): rows [{}, {}) x cols [{}, {}) are not all in the buffers",
                                x.q.begin, x.q.end, x.k.begin, x.k.end));
      if (qr.size() == 1 && kr.size() == 1) {
        add(x);
        continue;
      }
      const Band b = band_of(x);
      for (const BufferMap::Run& q : qr)
        for (const BufferMap::Run& k : kr) {
          sub.clear();
          band_to_slices(clip(b, q.global, k.global), sub);
          for (const Slice& y : sub) add(y);
        }
    }
  }
}

// Per xfer: whether two of its runs are adjacent in tokens (not in the
// buffer, else they would be one): only there can a tight slice, whose rows
// are contiguous needed rows, be cut.
std::vector<char> broken_xfers(const XferLayout& where) {
  std::vector<char> out(where.begin.empty() ? 0 : where.begin.size() - 1, 0);
  for (std::size_t x = 0; x < out.size(); ++x)
    for (std::size_t i = where.begin[x] + 1; i < where.begin[x + 1] && !out[x]; ++i)
      out[x] = where.runs[i - 1].global.end == where.runs[i].global.begin;
  return out;
}

}  // namespace

void sheet_calc(const Assignment& a, const Transfers& tr, const std::vector<int>& stage, int stages, bool local_tail,
                const HardwareProfile* hw, const TaskKernelSeconds* ks, Pass pass, const XferLayout* where,
                PriceSheet::Pass& out) {
  const TaskGrid& g = *a.grid;
  const std::size_t row = static_cast<std::size_t>(stages) + 1;
  out.area.assign(static_cast<std::size_t>(g.cp_size()) * row, 0);
  // Kernel seconds: each arg added to its stage in the plan's order (the
  // timing model sums a plan's stage the same way), then the stage's calls.
  const KernelModel* km = hw != nullptr && hw->kernel ? &*hw->kernel : nullptr;
  out.kernel.clear();
  std::vector<KernelStage> stage_of;
  std::vector<KernelArg> args;
  if (km)
    stage_of.assign(out.area.size(), KernelStage(*km, pass, task_flops_per_pair(g.problem(), g.flattened(), pass),
                                                 pass == Pass::fwd ? hw->fwd_tflops : hw->bwd_tflops));
  std::optional<BufferMaps> maps;
  std::vector<char> broken;
  if (km && where) {
    maps.emplace(BufferMaps{g.sharding(), *where});
    broken = broken_xfers(*where);
  }
  // (Each task's args at once, from the grid's.)
  if (km && ks == nullptr) throw Error("plan builder (internal): a kernel model's sheet without its task seconds");
  const int p = pass == Pass::fwd ? 0 : 1;
  LastReaders last(stages);
  for (std::size_t d = 0; d + 1 < tr.rank_begin.size(); ++d)
    for_each_staged_task(g, tr, stage, stages, local_tail, d, [&](std::size_t, const PlacedTask& pt, int st, int sq, int sk) {
      last.read(pt, st, sq, sk);
      const std::size_t i = d * row + static_cast<std::size_t>(st);
      out.area[i] += g.area(pt.t);
      if (!km) return;
      const BufferId qb = pt.xq < 0 ? BufferId::local : BufferId::remote;
      const BufferId kb = pt.xk < 0 ? BufferId::local : BufferId::remote;
      if (maps && !g.index_cells() && ((pt.xq >= 0 && broken[static_cast<std::size_t>(pt.xq)]) ||
                                       (pt.xk >= 0 && broken[static_cast<std::size_t>(pt.xk)]))) {
        placed_kernel_args(g, pt, *maps, args);  // cut where relayed rows land
        for (const KernelArg& x : args) stage_of[i].add(x, qb, kb);
        return;
      }
      const std::size_t u = ks->unit_of(pt.t);
      const TaskKernelSeconds::Stage& k = ks->stage[p][u];
      stage_of[i].add_task(k.femtos, k.unheld, k.forms, qb, kb);
    });
  if (km) {
    out.kernel.resize(stage_of.size());
    for (std::size_t i = 0; i < stage_of.size(); ++i) out.kernel[i] = stage_of[i].seconds();
  }
  if (tr.only >= 0) last.rank_only(tr, stages);
  out.qo_reduce_after.assign(last.q.begin() + 1, last.q.end());
  out.kv_reduce_after.assign(last.k.begin() + 1, last.k.end());
}

}  // namespace cpsched::plan_detail
