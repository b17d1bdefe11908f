#include "cpsched/problem/resources.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>
#include <fmt/format.h>

#include "cpsched/problem/task_grid.hpp"

namespace cpsched {

namespace {

// Bytes per item of the structures the estimate counts, with the allocator's
// overhead of each heap block (about 32 bytes).
constexpr std::int64_t kHeapBlock = 32;
// A cell: the struct, its three vectors' blocks, its dense/sparse index slot
// and the two row/col builders used while the grid is built.
constexpr std::int64_t kCellBytes = sizeof(Cell) + 3 * kHeapBlock + 64 + 2 * (24 + kHeapBlock);
// A (slice, cell) pair: the piece, its needed rows and cols (final and while building).
constexpr std::int64_t kTouchBytes = sizeof(Slice) + 4 * sizeof(Range);
// Per task: the assignment, a solver's per-task arrays (binary_greedy and
// balanced_bytes keep a few), the builder's task indices and its transfers.
constexpr std::int64_t kTaskBytes = 4 + 64 + 12 + 2 * (56 + sizeof(Range));
// Per task and pass: the comm splits on both sides of its transfers.
constexpr std::int64_t kTaskCommBytes = 2 * 72;
// A tight attention arg (a clipped piece gives up to three).
constexpr std::int64_t kArgBytes = kPlanArgBytes;
// A transferred range, per pass: its comm split on the sender (size, range,
// group, dst list) and the receiver (size, source, group), and the range
// itself in its transfer. Each (piece, group) adds at most one range of rows
// and one of cols.
constexpr std::int64_t kRangeBytes = 8 + 16 + 4 + 24 + kHeapBlock + 8 + 4 + 4 + 2 * sizeof(Range);

std::int64_t sat(__int128 v) {
  return v > std::numeric_limits<std::int64_t>::max() ? std::numeric_limits<std::int64_t>::max()
                                                       : static_cast<std::int64_t>(v);
}

}  // namespace

std::int64_t ResourceEstimate::total_bytes(bool sim_numeric, bool validate) const {
  return sat(__int128{mask_bytes} + selection_bytes + grid_bytes + plan_bytes + (validate ? validator_bytes : 0) +
             (sim_numeric ? sim_numeric_bytes : 0));
}

namespace {

struct SliceCounts {
  __int128 touches = 0, args = 0;  // args: tight attention args per head group (a full piece clips to 1, others to <= 3)
};

// Cells each slice touches, as the grid builds them: a full slice touches
// every (q block, k block) of its rectangle; a diagonal one is walked by q
// block (the grid walks it the same way).
SliceCounts count_slices(const std::vector<Slice>& slices, const Sharding& sh) {
  SliceCounts c;
  for (const Slice& s : slices) {
    const __int128 before = c.touches;
    const int qb0 = sh.block_of(s.q.begin), qb1 = sh.block_of(s.q.end - 1);
    if (qb0 < 0 || qb1 < 0) continue;
    if (s.type == MaskType::full) {
      const int kb0 = sh.block_of(s.k.begin), kb1 = sh.block_of(s.k.end - 1);
      if (kb0 < 0 || kb1 < 0) continue;
      c.touches += __int128{qb1 - qb0 + 1} * (kb1 - kb0 + 1);
      c.args += c.touches - before;
      continue;
    }
    for (int qb = qb0; qb <= qb1; ++qb) {
      const Range need = slice_needed_cols(s, sh.blocks[static_cast<std::size_t>(qb)], s.k);
      if (need.empty()) continue;
      c.touches += sh.block_of(need.end - 1) - sh.block_of(need.begin) + 1;
    }
    c.args += 3 * (c.touches - before);
  }
  return c;
}

int hardware_threads() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

// Token top-k masks: the counts of one pass over the indices, then the
// structures that hold them (cells.hpp, task_grid.cpp, calc.cpp, validator_calc.cpp).
void estimate_topk(const Problem& p, const Sharding& sh, ResourceEstimate& e) {
  const IndexMask& m = *p.index_mask;
  const bool per_head = m.kv_heads > 1;  // the grid's per-group cells (TaskGrid::per_group_cells)
  IndexCountOptions o;
  o.per_head = per_head;
  const IndexPlanCounts c = count_index_plan(m, sh.blocks, o);
  const __int128 nb = sh.num_blocks(), G = p.num_groups(), S = m.seqlen, H = m.kv_heads;
  const __int128 cell_heads = per_head ? H : 1;
  const __int128 union_cells = per_head ? std::min<__int128>(c.cells, nb * nb) : c.cells;
  const __int128 tasks = union_cells * G;
  // A shared selection is computed once per head group: its pools and args repeat G times.
  const __int128 reps = per_head ? 1 : G;
  const __int128 pool = __int128{c.pool} * reps;
  const __int128 args = __int128{2} * c.row_ranges * reps;  // a row range may split into two runs of the q buffer
  const __int128 ranges = __int128{c.row_ranges} + c.col_ranges;
  e.cells = sat(union_cells);
  e.touches = sat(c.cells);
  e.tasks = sat(tasks);
  e.selected_pairs = c.pairs;
  e.index_pool = sat(pool);
  e.mask_bytes = sat(__int128{m.indices.size()} * 4);
  e.selection_bytes = sat((H * S + 1) * 8 + __int128{c.pairs} * 4);
  // The index cells and their ranges (count_index_cells), count_index_cells'
  // per-thread tables (area, last row, rows per cell; the block's key bytes;
  // the row checks' bitmap and stamps), and the grid's own cells (per-group
  // cells copy each head's and unite them per block pair). Threads cut the
  // rows anywhere, so each may hold every table.
  const __int128 T = hardware_threads();
  const __int128 counting = T * (cell_heads * nb * (8 + 8 + 24) + cell_heads * S + S / 8 + S);
  __int128 grid = __int128{c.cells} * (sizeof(IndexCell) + 2 * kHeapBlock) + ranges * sizeof(Range) + counting +
                  nb * (sizeof(Range) + sizeof(Rank) + 24);
  if (per_head) grid += tasks * sizeof(Cell) + union_cells * (sizeof(Cell) + 2 * kHeapBlock) + ranges * sizeof(Range);
  e.grid_bytes = sat(grid);
  // Plan, both passes: per task the assignment, solver state, transfers and
  // comm; the index args and their pools (each rank's pool is trimmed to its
  // size once built, so at most one rank's growth slack is live); the
  // transferred ranges.
  const __int128 P = std::max(1, sh.cp_size);
  const __int128 pool_bytes = 2 * pool * 4 + 3 * pool * 4 / P;
  e.plan_bytes = sat(tasks * (kTaskBytes + 2 * kTaskCommBytes) + 2 * args * kArgBytes + pool_bytes +
                     ranges * reps * 2 * kRangeBytes * 2);
  // The validator: one chunk of pairs, a descriptor per index arg, and per
  // rank a bitmap of its remote rows (one rank at a time).
  const MemoryBudget b = default_memory_budget();
  e.validator_bytes = sat(__int128{validator_chunk_bytes(b.bytes)} + args * 64 + S / 8 * 2 + tasks);
}

}  // namespace

ResourceEstimate estimate_resources(const Problem& p) { return estimate_resources(p, p.sharding); }

ResourceEstimate estimate_resources(const Problem& p, const Sharding& sh) {
  ResourceEstimate e;
  const std::int64_t nb = sh.num_blocks();
  e.blocks = nb;
  const __int128 G = p.num_groups();
  if (p.index_mask) {
    estimate_topk(p, sh, e);
  } else if (!p.head_masks.empty()) {
    // Block selections of several heads: one range mask per head group; the
    // grid keeps a cell per (block pair, group) over the union of the groups'
    // block pairs, each group's own args.
    __int128 touches = 0, args = 0, slices = 0, cells = 0;
    for (const RangeMask& hm : p.head_masks) {
      const SliceCounts c = count_slices(hm.slices(), sh);
      touches += c.touches;
      args += c.args;
      slices += static_cast<__int128>(hm.slices().size());
      cells += std::min<__int128>(c.touches, __int128{nb} * nb);
    }
    const __int128 union_cells = std::min<__int128>(cells, __int128{nb} * nb);
    const __int128 tasks = union_cells * G;
    e.touches = sat(touches);
    e.cells = sat(union_cells);
    e.tasks = sat(tasks);
    e.mask_bytes = sat(slices * sizeof(Slice));
    e.grid_bytes = sat(tasks * kCellBytes + union_cells * kCellBytes + touches * (kTouchBytes + 2 * sizeof(Range)) +
                       __int128{nb} * (sizeof(Range) + sizeof(Rank)));
    e.plan_bytes = sat(tasks * (kTaskBytes + 2 * kTaskCommBytes) + args * kArgBytes * 2 + touches * 2 * kRangeBytes * 2);
    e.validator_bytes = sat(args * 2 * 80 + tasks);
  } else {
    const SliceCounts c = count_slices(p.mask.slices(), sh);
    const __int128 cells = std::min<__int128>(c.touches, __int128{nb} * nb);
    const __int128 tasks = cells * G;
    e.touches = sat(c.touches);
    e.cells = sat(cells);
    e.tasks = sat(tasks);
    e.mask_bytes = sat(static_cast<__int128>(p.mask.slices().size()) * sizeof(Slice));
    e.grid_bytes = sat(cells * kCellBytes + c.touches * kTouchBytes + __int128{nb} * (sizeof(Range) + sizeof(Rank)));
    // Plan: per task the assignment, transfers and comm; per head group the
    // tight args of every piece and its transferred ranges, in each of the two
    // passes (an upper bound: local pieces move nothing).
    e.plan_bytes = sat(tasks * (kTaskBytes + 2 * kTaskCommBytes) + c.args * G * kArgBytes * 2 +
                       c.touches * G * 2 * kRangeBytes * 2);
    // The validator: every arg's pieces per cell (an Item each, sorted), the tasks seen.
    e.validator_bytes = sat(c.args * G * 2 * 80 + tasks);
  }
  // sim numeric: fp32 Q, O, dO, dQ and their reference (hq), K, V, dK, dV,
  // their reference and the ranks' copies (hkv), and lse (3 x hq).
  // d_qk rows (Q, dQ, K, dK) and d_v rows (O, dO, V, dV; none for V when shared).
  const __int128 S = p.seqlen(), dqk = p.heads.dqk(), dv = p.heads.dv(), hq = p.heads.q, hkv = p.heads.kv;
  const __int128 dkv = dqk + (p.heads.kv_shared ? 0 : dv);
  e.sim_numeric_bytes = sat(4 * S * (hq * (3 * dqk + 3 * dv) + 4 * hkv * dkv + 3 * hq));
  return e;
}

void check_resources(const Problem& p, const ResourceEstimate& e, const MemoryBudget& budget, bool sim_numeric,
                     bool validate) {
  if (budget.bytes <= 0) return;
  const std::int64_t need = e.total_bytes(sim_numeric, validate);
  if (need <= budget.bytes) return;
  auto b = [](std::int64_t x) { return format_bytes(static_cast<double>(x)); };
  const bool index = p.index_mask != nullptr || !p.head_masks.empty();
  const bool by_blocks = p.grid.blocks_per_rank > 1;
  const std::string key = index ? "mask" : by_blocks ? "grid.blocks_per_rank" : "cp_size";
  std::string parts;
  if (e.mask_bytes >= (std::int64_t{1} << 20)) parts += fmt::format("mask {}, ", b(e.mask_bytes));
  if (p.index_mask)
    parts += fmt::format("sorted selection rows {} ({} selected pairs), ", b(e.selection_bytes), e.selected_pairs);
  parts += fmt::format("grid {} ({} cells, {} slice pieces), plan {} ({} tasks = cells x {} head groups", b(e.grid_bytes),
                       e.cells, e.touches, b(e.plan_bytes), e.tasks, p.num_groups());
  if (p.index_mask) parts += fmt::format("; index pools 2 x {} entries", e.index_pool);
  parts += ")";
  if (validate) parts += fmt::format(", validator {}", b(e.validator_bytes));
  if (sim_numeric) parts += fmt::format(", numeric simulation {}", b(e.sim_numeric_bytes));
  std::string change;
  if (p.index_mask) {
    const IndexMask& m = *p.index_mask;
    change = fmt::format("lower the selection's width (problem.mask.topk for kind dsa; the indices' last dimension, "
                         "{} here), problem.seqlen_per_rank or problem.grid.blocks_per_rank ({})",
                         m.indices.shape.size() == 3 ? m.indices.shape[2] : 0, p.grid.blocks_per_rank);
  } else if (index) {
    change = fmt::format("select fewer blocks (problem.mask.nsa_top for kind nsa), lower problem.seqlen_per_rank or "
                         "problem.grid.blocks_per_rank ({})",
                         p.grid.blocks_per_rank);
  } else if (by_blocks) {
    change = fmt::format("lower problem.grid.blocks_per_rank ({}) or problem.cp_size ({})", p.grid.blocks_per_rank,
                         p.cp_size());
  } else {
    change = fmt::format("lower problem.cp_size ({}) or problem.seqlen_per_rank", p.cp_size());
  }
  // The size to raise the budget to: the estimate, rounded up to a GiB (or a MiB below one).
  const double gib = static_cast<double>(need) / static_cast<double>(std::int64_t{1} << 30);
  const std::string raise_to =
      gib >= 1 ? fmt::format("{}G", static_cast<std::int64_t>(std::ceil(gib)))
               : fmt::format("{}M", static_cast<std::int64_t>(std::ceil(static_cast<double>(need) / (1 << 20))));
  throw LimitError(key, fmt::format("problem.{}: the estimated memory {} ({}) exceeds the memory budget {} ({}); raise "
                                    "the budget to at least {} (memory_budget: {} in the config, --set memory_budget={}, "
                                    "or CPSCHED_MEMORY_BUDGET={}), or {}{}{}",
                                    key, b(need), parts, b(budget.bytes), budget.source, raise_to, raise_to, raise_to,
                                    raise_to, change, index ? "" : ", use a sparser mask",
                                    sim_numeric ? ", use the sim's mode: timing" : ""));
}

void check_resources(const Problem& p, bool sim_numeric, bool validate) {
  const ResourceEstimate e = estimate_resources(p);
  MemoryBudget b = configured_memory_budget();
  if (b.bytes <= 0) {
    // Reading /proc/meminfo costs more than a small solve; what needs less
    // than kMemAvailableFloor fits any machine that runs the planner.
    if (e.total_bytes(sim_numeric, validate) < kMemAvailableFloor) return;
    b = default_memory_budget();
  }
  if (b.bytes <= 0) return;
  check_resources(p, e, b, sim_numeric, validate);
}

}  // namespace cpsched
