// The index args (token top-k masks, plan.hpp) of one rank's tasks and its
// index pool: counted first (rows x width per run), then written in place,
// each task's part of the pool by one of up to the hardware's threads.
#include <algorithm>
#include <limits>
#include <memory>
#include <span>

#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "mask/index/internal.hpp"
#include "plan/builder/buffer_map.hpp"
#include "plan/builder/internal.hpp"
#include "plan/index/stream_out.hpp"

namespace cpsched::plan_detail {

namespace {

// A transfer's rows in the remote buffer as a table over its key block:
// row[t - begin] is token t's buffer row, -1 where t was not sent. Built
// once per transfer for tasks with many keys (at least a quarter of the
// block): it costs the block once, and saves a search and a walk per key.
struct DenseRows {
  Token begin = 0;
  std::vector<std::int32_t> row;
  std::int32_t of = -1;  // the transfer it holds

  const DenseRows* of_transfer(const XferLayout& where, std::int32_t x, Range kblock) {
    if (x != of) {
      begin = kblock.begin;
      row.assign(static_cast<std::size_t>(kblock.size()), -1);
      const auto xi = static_cast<std::size_t>(x);
      for (std::size_t i = where.begin[xi]; i < where.begin[xi + 1]; ++i) {
        const XferRun& run = where.runs[i];
        if (run.global.begin < kblock.begin || run.global.end > kblock.end)
          throw Error("plan builder (internal): a transfer's rows leave its key block");
        for (Token q = run.global.begin; q < run.global.end; ++q)
          row[static_cast<std::size_t>(q - kblock.begin)] = static_cast<std::int32_t>(q - run.global.begin + run.off);
      }
      of = x;
    }
    return this;
  }
};

// Buffer rows of ascending global tokens (all there) through a transfer's
// runs, written to out[0, keys.size()): one search, then a walk.
void walk_rows(const BufferMap& m, std::span<const std::int32_t> keys, std::int32_t* out) {
  if (keys.empty()) return;
  auto it = std::upper_bound(m.first, m.last, Token{keys.front()}, [](Token v, const XferRun& x) { return v < x.global.end; });
  for (std::int32_t t : keys) {
    while (it != m.last && it->global.end <= t) ++it;
    if (it == m.last || !it->global.contains(t))
      throw Error(fmt::format("plan builder (internal): key {} is not in the kv buffer", t));
    *out++ = static_cast<std::int32_t>(t - it->global.begin + it->off);
  }
}

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
std::size_t index_pool_entries(const SelectionRows& sel, int head, const Cell& c, Range kblock, const BufferMap& qm,
                               std::vector<BufferMap::Run>& runs, std::vector<RowPart>& parts) {
  std::size_t n = 0;
  for (Range rows : c.rows.ranges()) {
    if (!qm.runs(rows, runs)) return n;  // emit_index_args reports it
    for (const BufferMap::Run& run : runs) {
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
void emit_index_args(const SelectionRows& sel, int head, const Cell& c, Range kblock, const BufferMap& qm,
                     const BufferMap& km, const DenseRows* dense, int group, std::vector<BufferMap::Run>& runs,
                     std::vector<std::span<const std::int32_t>>& spans, std::vector<AttnArg>& out,
                     PoolWriter* pool) {
  for (Range rows : c.rows.ranges()) {
    if (!qm.runs(rows, runs))
      throw Error(fmt::format("plan builder (internal): rows [{}, {}) are not all in the q buffer", rows.begin,
                              rows.end));
    for (const BufferMap::Run& run : runs) {
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
      // Local rows ascend with the keys; remote ones need not (relays
      // append forwarded rows), so their hull is taken entry by entry.
      StreamOut w(pool->base + pool->size);
      Token lo = std::numeric_limits<Token>::max(), hi = std::numeric_limits<Token>::min();
      for (const auto keys : spans) {
        if (km.first == nullptr) {
          w.shifted(keys, static_cast<std::int32_t>(km.shift));
          if (!keys.empty()) {
            lo = std::min<Token>(lo, keys.front() + km.shift);
            hi = std::max<Token>(hi, keys.back() + km.shift + 1);
          }
        } else {
          std::int32_t l = std::numeric_limits<std::int32_t>::max(), h = -1;
          if (dense != nullptr) {
            if (w.gathered(keys, dense->row.data() - dense->begin, l, h) < 0)  // -1: a key not sent
              throw Error(fmt::format("plan builder (internal): a key of [{}, {}] is not in the kv buffer",
                                      keys.front(), keys.back()));
          } else {
            std::int32_t* row = w.at();
            walk_rows(km, keys, row);
            for (std::size_t e = 0; e < keys.size(); ++e) {
              l = std::min(l, row[e]);
              h = std::max(h, row[e]);
            }
            w.skip(keys.size());
          }
          if (!keys.empty()) {
            lo = std::min<Token>(lo, l);
            hi = std::max<Token>(hi, Token{h} + 1);
          }
        }
        w.fill(width - keys.size(), -1);
      }
      w.finish();
      pool->size += spans.size() * width;
      a.k = {lo, hi};
      out.push_back(a);
    }
  }
}

// Contiguous runs of [0, n) items, cut where the running cost (cost[i] =
// cost of items before i, n + 1 entries) crosses equal shares.
std::vector<std::size_t> cut_evenly(const std::vector<std::size_t>& cost, int parts) {
  std::vector<std::size_t> cut(static_cast<std::size_t>(parts) + 1);
  const std::size_t n = cost.size() - 1;
  for (int p = 0; p <= parts; ++p) {
    const std::size_t target = cost[n] / static_cast<std::size_t>(parts) * static_cast<std::size_t>(p);
    cut[static_cast<std::size_t>(p)] =
        p == parts ? n : static_cast<std::size_t>(std::lower_bound(cost.begin(), cost.end(), target) - cost.begin());
  }
  for (int p = 1; p <= parts; ++p)
    cut[static_cast<std::size_t>(p)] = std::max(cut[static_cast<std::size_t>(p)], cut[static_cast<std::size_t>(p) - 1]);
  return cut;
}


}  // namespace

RankIndexArgs rank_index_args(const Assignment& a, const Transfers& tr, const XferLayout& where, std::size_t d,
                              bool write_pool, BufferRecycler* buffers) {
  const TaskGrid& g = *a.grid;
  const Sharding& sh = g.sharding();
  const BufferMaps maps{sh, where};
  const std::size_t first = tr.rank_begin[d], n = tr.rank_begin[d + 1] - first;
  struct Task {
    TaskId t;
    const Cell* c;
    int group, head;
    BufferMap qm, km;
    std::int32_t xk;
    Range kblock;
  };
  std::vector<Task> tasks;
  tasks.reserve(n);
  for (std::size_t i = first; i < first + n; ++i) {
    const PlacedTask p = placed_task(g, tr, i);
    const Cell& c = *p.cell;
    tasks.push_back({p.t, &c, p.group, g.per_group_cells() ? p.group : 0, maps.of(p.xq, c.qblock),
                     maps.of(p.xk, c.kblock), p.xk, sh.blocks[static_cast<std::size_t>(c.kblock)]});
  }
  const SelectionRows& sel = g.selection();
  RankIndexArgs out;
  out.args.resize(n);
  if (!write_pool) {  // shapes and areas only
    std::vector<BufferMap::Run> runs;
    std::vector<std::span<const std::int32_t>> spans;
    for (std::size_t i = 0; i < n; ++i) {
      const Task& x = tasks[i];
      emit_index_args(sel, x.head, *x.c, x.kblock, x.qm, x.km, nullptr, x.group, runs, spans, out.args[i], nullptr);
    }
    return out;
  }

  // Count: each task's entries and its rows' parts, tasks cut by rows.
  std::vector<std::size_t> rows(n + 1, 0), entries(n + 1, 0);
  for (std::size_t i = 0; i < n; ++i) rows[i + 1] = rows[i] + static_cast<std::size_t>(tasks[i].c->rows.size());
  std::vector<std::vector<RowPart>> parts(n);
  std::vector<std::size_t> task_entries(n, 0);
  {
    const int T = threads_for(rows[n], 4096);
    const std::vector<std::size_t> cut = cut_evenly(rows, T);
    index_detail::run_threads(T, [&](int w) {
      std::vector<BufferMap::Run> runs;
      for (std::size_t i = cut[static_cast<std::size_t>(w)]; i < cut[static_cast<std::size_t>(w) + 1]; ++i) {
        const Task& x = tasks[i];
        task_entries[i] = index_pool_entries(sel, x.head, *x.c, x.kblock, x.qm, runs, parts[i]);
      }
    });
  }
  for (std::size_t i = 0; i < n; ++i) entries[i + 1] = entries[i] + task_entries[i];

  // Write: each task its own part of the pool, tasks cut by entries.
  const std::size_t total = entries[n];
  std::shared_ptr<std::int32_t[]> store = total > 0 ? take_buffer(buffers, total) : nullptr;  // (not zero-filled)
  const int T = threads_for(total, std::size_t{1} << 20);
  const std::vector<std::size_t> cut = cut_evenly(entries, T);
  index_detail::run_threads(T, [&](int w) {
    DenseRows dense;
    std::vector<BufferMap::Run> runs;
    std::vector<std::span<const std::int32_t>> spans;
    for (std::size_t i = cut[static_cast<std::size_t>(w)]; i < cut[static_cast<std::size_t>(w) + 1]; ++i) {
      const Task& x = tasks[i];
      const bool many = x.xk >= 0 && g.area(x.t) >= x.kblock.size() / 4;
      PoolWriter pool{store.get(), entries[i], entries[i + 1], parts[i].data()};
      emit_index_args(sel, x.head, *x.c, x.kblock, x.qm, x.km, many ? dense.of_transfer(where, x.xk, x.kblock) : nullptr,
                      x.group, runs, spans, out.args[i], &pool);
      if (pool.size != entries[i + 1]) throw Error("plan builder (internal): an index arg's rows miss their count");
    }
  });
  out.pool = IndexPool(std::move(store), total);
  return out;
}

}  // namespace cpsched::plan_detail
