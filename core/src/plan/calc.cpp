// The attention args (CalcMeta) of every rank and stage.
#include <algorithm>
#include <limits>
#include <memory>
#include <span>
#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/slice_clip.hpp"
#include "plan/builder_internal.hpp"

namespace cpsched::plan_detail {

namespace {

// A transfer's rows in the remote buffer as a table over its key block:
// row[t - begin] is token t's buffer row, -1 where t was not sent.
struct DenseRows {
  Token begin = 0;
  std::vector<std::int32_t> row;
};

// Where global tokens of one block sit in a buffer: a single shift (local
// shard), or the runs of a transfer's rows in the remote buffer.
struct Map {
  BufferId buf = BufferId::local;
  Token shift = 0;                    // local: buffer = global + shift
  const XferRun* first = nullptr;     // remote: the xfer's runs, sorted by token
  const XferRun* last = nullptr;

  struct Run {
    Range global;
    Token shift;
  };
  // The runs of r in the buffer; false when some token of r is not there.
  bool runs(Range r, std::vector<Run>& out) const {
    out.clear();
    if (first == nullptr) {
      out.push_back({r, shift});
      return true;
    }
    // Binary search for the first run that ends after r.begin: a piece
    // costs O(log runs + its runs), not O(runs) (one-token stripes give
    // transfers of thousands of ranges).
    auto it = std::upper_bound(first, last, r.begin, [](Token v, const XferRun& x) { return v < x.global.end; });
    Token covered = 0;
    for (; it != last && it->global.begin < r.end; ++it) {
      const Range y = it->global.intersect(r);
      if (!y.empty()) {
        out.push_back({y, it->off - it->global.begin});
        covered += y.size();
      }
    }
    return covered == r.size();
  }
  // Buffer rows of ascending global tokens (all there), written to
  // out[0, keys.size()). Local: a shift; remote: through `dense` when given
  // (DenseRows: one load per key, -1 for a token not there), else one
  // search, then a walk along the runs.
  void rows_of(std::span<const std::int32_t> keys, std::int32_t* out, const DenseRows* dense) const {
    if (keys.empty()) return;
    if (first == nullptr) {
      const auto s = static_cast<std::int32_t>(shift);
      for (std::size_t i = 0; i < keys.size(); ++i) out[i] = keys[i] + s;
      return;
    }
    if (dense != nullptr) {
      const std::int32_t* row = dense->row.data() - dense->begin;
      std::int32_t missing = 0;
      for (std::size_t i = 0; i < keys.size(); ++i) {
        out[i] = row[keys[i]];
        missing |= out[i];  // -1 has the sign bit, no row has
      }
      if (missing < 0)
        throw Error(fmt::format("plan builder (internal): a key of [{}, {}] is not in the kv buffer", keys.front(),
                                keys.back()));
      return;
    }
    auto it = std::upper_bound(first, last, Token{keys.front()}, [](Token v, const XferRun& x) { return v < x.global.end; });
    for (std::int32_t t : keys) {
      while (it != last && it->global.end <= t) ++it;
      if (it == last || !it->global.contains(t))
        throw Error(fmt::format("plan builder (internal): key {} is not in the kv buffer", t));
      *out++ = static_cast<std::int32_t>(t - it->global.begin + it->off);
    }
  }
  // Buffer row of global token t (which must be there).
  Token row_of(Token t) const {
    if (first == nullptr) return t + shift;
    auto it = std::upper_bound(first, last, t, [](Token v, const XferRun& x) { return v < x.global.end; });
    if (it == last || !it->global.contains(t))
      throw Error(fmt::format("plan builder (internal): key {} is not in the kv buffer", t));
    return t - it->global.begin + it->off;
  }
};

// A row's keys inside a key block: where they start in the row, how many.
// Found once per (row, task) by two searches when the pool is counted, and
// read back when it is written (the searches on a rank's 32 MiB of rows were
// a sixth of its DSA plan's time, done twice).
struct RowPart {
  std::uint32_t offset = 0, count = 0;
};

// The index-pool entries emit_index_args will write for one task (rows x
// width per run), so that the pool is allocated once: grown by doubling and
// trimmed, a rank's pool of a DSA layer (32 MiB at S = 32k, P = 8) was
// written about three times over. Appends each row's part to `parts`, in
// the order emit_index_args reads them.
std::size_t index_pool_entries(const SelectionRows& sel, int head, const Cell& c, Range kblock, const Map& qm,
                               std::vector<Map::Run>& runs, std::vector<RowPart>& parts) {
  std::size_t n = 0;
  for (Range rows : c.rows.ranges()) {
    if (!qm.runs(rows, runs)) return n;  // emit_index_args reports it
    for (const Map::Run& run : runs) {
      std::size_t width = 0;
      for (Token q = run.global.begin; q < run.global.end; ++q) {
        const auto all = sel.row(head, q);
        const auto in = sel.row(head, q, kblock);
        parts.push_back({static_cast<std::uint32_t>(in.data() - all.data()), static_cast<std::uint32_t>(in.size())});
        width = std::max(width, in.size());
      }
      n += static_cast<std::size_t>(run.global.size()) * width;
    }
  }
  return n;
}

// Where emit_index_args writes a rank's pool: sized first (index_pool_entries),
// so each entry is written once, in place; `part` reads the rows' parts that
// the count found, in order.
struct PoolWriter {
  std::int32_t* base = nullptr;
  std::size_t size = 0, capacity = 0;
  const RowPart* part = nullptr;
};

// Index args of one task (token top-k masks): per run of its query rows that
// is contiguous in the q buffer, one arg whose rows list their selected keys
// inside the task's kv block as kv-buffer rows, -1 padded to the run's widest
// row.
// `spans`: scratch for the run's rows inside the kv block. `pool` null: shapes
// and areas only (PlanOptions::index_rows = false).
void emit_index_args(const SelectionRows& sel, int head, const Cell& c, Range kblock, const Map& qm,
                     const Map& km, const DenseRows* dense, int group, std::vector<Map::Run>& runs,
                     std::vector<std::span<const std::int32_t>>& spans, std::vector<AttnArg>& out,
                     PoolWriter* pool) {
  for (Range rows : c.rows.ranges()) {
    if (!qm.runs(rows, runs))
      throw Error(fmt::format("plan builder (internal): rows [{}, {}) are not all in the q buffer", rows.begin,
                              rows.end));
    for (const Map::Run& run : runs) {
      std::size_t width = 0;
      Token area = 0;
      spans.clear();
      for (Token q = run.global.begin; q < run.global.end; ++q) {
        if (pool != nullptr) {
          const RowPart part = *pool->part++;
          spans.push_back(sel.row(head, q).subspan(part.offset, part.count));
        } else {
          spans.push_back(sel.row(head, q, kblock));
        }
        width = std::max(width, spans.back().size());
        area += static_cast<Token>(spans.back().size());
      }
      if (width == 0) continue;
      AttnArg a{{run.global.begin + run.shift, run.global.end + run.shift}, {0, 0}, MaskType::full, qm.buf, km.buf,
                group, static_cast<std::int32_t>(width), pool ? static_cast<std::int64_t>(pool->size) : 0, area};
      if (pool == nullptr) {  // k is the cell's cols
        a.k = {km.row_of(c.cols.ranges().front().begin), km.row_of(c.cols.ranges().back().end - 1) + 1};
        out.push_back(a);
        continue;
      }
      if (pool->size + spans.size() * width > pool->capacity)
        throw Error("plan builder (internal): the index pool outgrew its count");
      std::int32_t* row = pool->base + pool->size;
      Token lo = std::numeric_limits<Token>::max(), hi = std::numeric_limits<Token>::min();
      for (const auto keys : spans) {
        km.rows_of(keys, row, dense);
        if (km.first == nullptr) {  // local rows ascend with the keys
          if (!keys.empty()) {
            lo = std::min<Token>(lo, row[0]);
            hi = std::max<Token>(hi, row[keys.size() - 1] + 1);
          }
        } else {  // (remote rows need not: relays append forwarded rows)
          std::int32_t l = std::numeric_limits<std::int32_t>::max(), h = -1;
          for (std::size_t e = 0; e < keys.size(); ++e) {
            l = std::min(l, row[e]);
            h = std::max(h, row[e]);
          }
          lo = std::min<Token>(lo, l);
          hi = std::max<Token>(hi, Token{h} + 1);
        }
        std::fill(row + keys.size(), row + width, -1);
        row += width;
      }
      pool->size += spans.size() * width;
      a.k = {lo, hi};
      out.push_back(a);
    }
  }
}

struct ArgSink {
  std::vector<Map::Run> qr, kr;
  std::vector<Slice> sub;

  void push(std::vector<AttnArg>& out, const Slice& s, const Map& qm, Token dq, const Map& km, Token dk,
            int group) {
    out.push_back(AttnArg{{s.q.begin + dq, s.q.end + dq}, {s.k.begin + dk, s.k.end + dk}, s.type, qm.buf,
                          km.buf, group});
  }

  // A tight slice (global coords) as args in buffer coords; pieces that
  // straddle a discontinuity of either buffer are cut there.
  void emit(const Slice& s, const Map& qm, const Map& km, int group, std::vector<AttnArg>& out) {
    if (!qm.runs(s.q, qr) || !km.runs(s.k, kr))
      throw Error(fmt::format("plan builder (internal): rows [{}, {}) x cols [{}, {}) are not all in the buffers",
                              s.q.begin, s.q.end, s.k.begin, s.k.end));
    if (qr.size() == 1 && kr.size() == 1) {
      push(out, s, qm, qr[0].shift, km, kr[0].shift, group);
      return;
    }
    const Band b = band_of(s);
    for (const Map::Run& q : qr)
      for (const Map::Run& k : kr) {
        sub.clear();
        band_to_slices(clip(b, q.global, k.global), sub);
        for (const Slice& x : sub) push(out, x, qm, q.shift, km, k.shift, group);
      }
  }
};

}  // namespace

void build_calc(const Assignment& a, const Transfers& tr, const std::vector<int>& stage, const XferLayout& where,
                int stages, std::vector<PassPlan*>& pass, bool index_rows, bool area_only, Rank only,
                BufferRecycler* buffers) {
  const TaskGrid& g = *a.grid;
  const Sharding& sh = g.sharding();
  const std::vector<Token> block_off = block_local_offsets(sh);
  const auto G = static_cast<std::size_t>(g.num_groups());
  const bool flat = g.flattened();
  auto mine = [&](std::size_t r) { return only < 0 || static_cast<Rank>(r) == only; };
  for (std::size_t r = 0; r < pass.size(); ++r) {
    if (!mine(r)) continue;
    PassPlan* p = pass[r];
    p->calc.local_attn_args.clear();
    p->calc.indices = {};
    p->calc.remote_attn_args.assign(static_cast<std::size_t>(stages), {});
  }
  std::vector<int> last_q(static_cast<std::size_t>(stages) + 1, 0), last_k = last_q;
  ArgSink sink;
  std::vector<Slice> tight;
  std::vector<Map::Run> runs;
  std::vector<std::span<const std::int32_t>> spans;
  std::vector<RowPart> parts;
  const bool index = g.index_cells();
  // The dense table of the remote transfer last used (tasks of one transfer
  // come together in a rank's order), for tasks with many keys: building it
  // costs the key block once, and saves a search and a walk per key.
  DenseRows dense;
  std::int32_t dense_of = -1;
  auto dense_for = [&](std::int32_t x, Range kblock, TaskId t) -> const DenseRows* {
    if (x < 0 || g.area(t) < kblock.size() / 4) return nullptr;
    if (x != dense_of) {
      dense.begin = kblock.begin;
      dense.row.assign(static_cast<std::size_t>(kblock.size()), -1);
      const auto xi = static_cast<std::size_t>(x);
      for (std::size_t i = where.begin[xi]; i < where.begin[xi + 1]; ++i) {
        const XferRun& run = where.runs[i];
        if (run.global.begin < kblock.begin || run.global.end > kblock.end)
          throw Error("plan builder (internal): a transfer's rows leave its key block");
        for (Token q = run.global.begin; q < run.global.end; ++q)
          dense.row[static_cast<std::size_t>(q - kblock.begin)] = static_cast<std::int32_t>(q - run.global.begin + run.off);
      }
      dense_of = x;
    }
    return &dense;
  };

  auto map_of = [&](std::int32_t x, std::int32_t block) {
    if (x < 0) {
      const auto b = static_cast<std::size_t>(block);
      return Map{BufferId::local, block_off[b] - sh.blocks[b].begin, nullptr, nullptr};
    }
    const auto xi = static_cast<std::size_t>(x);
    const XferRun* base = where.runs.data();
    return Map{BufferId::remote, 0, base + where.begin[xi], base + where.begin[xi + 1]};
  };

  std::vector<Token> stage_area(static_cast<std::size_t>(stages) + 1);
  for (std::size_t d = 0; d + 1 < tr.rank_begin.size(); ++d) {
    CalcMeta& calc = pass[d]->calc;
    if (area_only) std::fill(stage_area.begin(), stage_area.end(), 0);
    // The rank's pool, counted first and written in place.
    std::shared_ptr<std::int32_t[]> store;
    PoolWriter pool;
    const bool write_pool = index && index_rows && !area_only && mine(d);
    parts.clear();
    if (write_pool) {
      for (std::size_t i = tr.rank_begin[d]; i < tr.rank_begin[d + 1]; ++i) {
        const auto t = static_cast<TaskId>(tr.task_order[i]);
        const Cell& c = g.cell_of(t);
        const int grp = flat ? static_cast<int>(static_cast<std::size_t>(t) % G) : -1;
        pool.capacity += index_pool_entries(g.selection(), g.per_group_cells() ? grp : 0, c,
                                            sh.blocks[static_cast<std::size_t>(c.kblock)],
                                            map_of(tr.task_q[static_cast<std::size_t>(t)], c.qblock), runs, parts);
      }
      pool.part = parts.data();
      if (pool.capacity > 0) {
        store = take_buffer(buffers, pool.capacity);  // (not zero-filled: every entry is written)
        pool.base = store.get();
      }
    }
    for (std::size_t i = tr.rank_begin[d]; i < tr.rank_begin[d + 1]; ++i) {
      const auto t = static_cast<TaskId>(tr.task_order[i]);
      const Cell& c = g.cell_of(t);
      const int grp = flat ? static_cast<int>(static_cast<std::size_t>(t) % G) : -1;
      const std::int32_t xq = tr.task_q[static_cast<std::size_t>(t)];
      const std::int32_t xk = tr.task_k[static_cast<std::size_t>(t)];
      const int sq = xq < 0 ? 0 : stage[static_cast<std::size_t>(xq)];
      const int sk = xk < 0 ? 0 : stage[static_cast<std::size_t>(xk)];
      const int st = std::max(sq, sk);
      if (xq >= 0) last_q[static_cast<std::size_t>(sq)] = std::max(last_q[static_cast<std::size_t>(sq)], st);
      if (xk >= 0) last_k[static_cast<std::size_t>(sk)] = std::max(last_k[static_cast<std::size_t>(sk)], st);
      if (!mine(d)) continue;
      if (area_only) {
        stage_area[static_cast<std::size_t>(st)] += g.area(t);
        continue;
      }
      std::vector<AttnArg>& out = st == 0 ? calc.local_attn_args : calc.remote_attn_args[static_cast<std::size_t>(st - 1)];
      const Map qm = map_of(xq, c.qblock), km = map_of(xk, c.kblock);
      const Range qb = sh.blocks[static_cast<std::size_t>(c.qblock)];
      const Range kb = sh.blocks[static_cast<std::size_t>(c.kblock)];
      if (index) {
        emit_index_args(g.selection(), g.per_group_cells() ? grp : 0, c, kb, qm, km,
                        write_pool ? dense_for(xk, kb, t) : nullptr, grp, runs, spans, out, write_pool ? &pool : nullptr);
        continue;
      }
      for (const Slice& s : c.pieces) {
        tight.clear();
        band_to_slices(clip(band_of(s), qb, kb), tight);
        for (const Slice& x : tight) sink.emit(x, qm, km, grp, out);
      }
    }
    if (!mine(d)) continue;
    if (write_pool) calc.indices = IndexPool(std::move(store), pool.size);
    if (area_only)
      for (int st = 0; st <= stages; ++st) {
        const Token area = stage_area[static_cast<std::size_t>(st)];
        if (area == 0) continue;
        const BufferId buf = st == 0 ? BufferId::local : BufferId::remote;
        (st == 0 ? calc.local_attn_args : calc.remote_attn_args[static_cast<std::size_t>(st - 1)])
            .push_back(AttnArg{{0, 1}, {0, 1}, MaskType::full, buf, buf, flat ? 0 : -1, 1, 0, area});
      }
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
