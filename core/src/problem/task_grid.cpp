#include "cpsched/problem/task_grid.hpp"

#include <algorithm>
#include <unordered_map>

#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/index/cells.hpp"
#include "cpsched/mask/index/summary.hpp"
#include "cpsched/base/limits.hpp"
#include "cpsched/problem/resources.hpp"

namespace cpsched {

TaskGrid::TaskGrid(std::shared_ptr<const Problem> problem)
    : problem_(std::move(problem)), sharding_(problem_->sharding) {
  build();
}

TaskGrid::TaskGrid(std::shared_ptr<const Problem> problem, Sharding sharding)
    : problem_(std::move(problem)), sharding_(std::move(sharding)) {
  sharding_.validate(problem_->seqlen());
  build();
}

namespace {

[[noreturn]] void too_many_tasks(std::size_t cells, int groups) {
  throw LimitError("grid.blocks_per_rank",
                   fmt::format("task grid: more than {} tasks ({} cells x {} head groups so far); fewer blocks "
                               "(problem.grid.blocks_per_rank, problem.cp_size) or a sparser mask fit",
                               limits::kMaxTasks, cells, groups));
}

bool by_blocks(const Cell& a, const Cell& b) { return std::pair{a.qblock, a.kblock} < std::pair{b.qblock, b.kblock}; }

}  // namespace

void TaskGrid::add_cell_count(std::size_t cells) {
  // Cells x groups must index as TaskId (limits.hpp).
  if (static_cast<std::int64_t>(cells) * groups_ > limits::kMaxTasks) too_many_tasks(cells, groups_);
}

// The cells of one range mask over the sharding, sorted by blocks; adds its
// area to `total`.
std::vector<Cell> TaskGrid::cells_of(const std::vector<Slice>& slices, Token& total) const {
  const auto nb = static_cast<std::int64_t>(sharding_.num_blocks());
  // Cell index by (qblock, kblock): dense table for grids up to 4M cells.
  const bool dense = nb * nb <= (std::int64_t{1} << 22);
  std::vector<std::int32_t> table(dense ? static_cast<std::size_t>(nb * nb) : 0, -1);
  std::unordered_map<std::int64_t, std::int32_t> sparse;
  auto slot = [&](std::int64_t key) -> std::int32_t& {
    if (dense) return table[static_cast<std::size_t>(key)];
    return sparse.try_emplace(key, -1).first->second;
  };

  const auto& blocks = sharding_.blocks;
  std::vector<Cell> cells;
  // Needed rows and cols come from many slices in no particular order:
  // collected per cell and merged once.
  std::vector<RangeSet::Builder> rows, cols;
  {
    // At most one cell per (slice, q block, k block) the loop below visits
    // (as many as the memory estimate counts, base/resources.cpp): reserved,
    // so that the cells are not moved (and new memory touched) as they grow.
    std::int64_t visits = 0;
    for (const Slice& s : slices) {
      for (int qb = sharding_.block_of(s.q.begin); qb < nb && blocks[qb].begin < s.q.end && visits < nb * nb; ++qb) {
        const Range need = blocks[qb].empty() ? Range{} : slice_needed_cols(s, blocks[qb], s.k);
        if (!need.empty()) visits += sharding_.block_of(need.end - 1) - sharding_.block_of(need.begin) + 1;
      }
    }
    const auto n = static_cast<std::size_t>(std::min(visits, nb * nb));
    cells.reserve(n);
    rows.reserve(n);
    cols.reserve(n);
  }
  bool in_order = true;  // each new cell's key above the one before
  std::int64_t last_key = -1;
  for (const Slice& s : slices) {
    const int qb0 = sharding_.block_of(s.q.begin);
    for (int qb = qb0; qb < nb && blocks[qb].begin < s.q.end; ++qb) {
      const Range qr = blocks[qb];
      if (qr.empty()) continue;
      // Only key blocks inside the cols this row block needs.
      const Range need = slice_needed_cols(s, qr, s.k);
      if (need.empty()) continue;
      for (int kb = sharding_.block_of(need.begin); kb < nb && blocks[kb].begin < need.end; ++kb) {
        const Range kr = blocks[kb];
        const Token a = slice_area(s, qr, kr);
        if (a == 0) continue;
        std::int32_t& idx = slot(std::int64_t{qb} * nb + kb);
        if (idx < 0) {
          if (static_cast<std::int64_t>(cells.size() + 1) * groups_ > limits::kMaxTasks)
            too_many_tasks(cells.size() + 1, groups_);
          idx = static_cast<std::int32_t>(cells.size());
          const std::int64_t key = std::int64_t{qb} * nb + kb;
          in_order = in_order && key > last_key;
          last_key = key;
          cells.push_back(Cell{qb, kb, 0, {}, {}, {}});
          rows.emplace_back();
          cols.emplace_back();
        }
        const auto i = static_cast<std::size_t>(idx);
        Cell& c = cells[i];
        // Checked: a problem built without Problem::validate() may be outside the limits.
        if (__builtin_add_overflow(c.area, a, &c.area) || __builtin_add_overflow(total, a, &total))
          throw LimitError("mask", "task grid: the mask area does not fit 64 bits (limits.hpp: mask area x "
                                   "query heads <= 2^62); call Problem::validate()");
        rows[i].add(slice_needed_rows(s, qr, kr));
        cols[i].add(slice_needed_cols(s, qr, kr));
        c.pieces.push_back(s);
      }
    }
  }
  for (std::size_t i = 0; i < cells.size(); ++i) {
    cells[i].rows = rows[i].build();
    cells[i].cols = cols[i].build();
  }
  // Made in key order already (one slice, or slices in row order that do not
  // overlap): nothing to move.
  if (in_order) return cells;
  // Sorted by blocks: each (qblock, kblock) key names one cell, so the cells
  // are moved once in key order (sorting the cells themselves swapped their
  // range sets and pieces: most of the grid's time on causal at P = 512).
  std::vector<Cell> sorted;
  sorted.reserve(cells.size());
  if (dense) {
    for (const std::int32_t i : table)
      if (i >= 0) sorted.push_back(std::move(cells[static_cast<std::size_t>(i)]));
  } else {
    std::vector<std::pair<std::int64_t, std::int32_t>> order(sparse.begin(), sparse.end());
    std::sort(order.begin(), order.end());
    for (const auto& [key, i] : order) sorted.push_back(std::move(cells[static_cast<std::size_t>(i)]));
  }
  return sorted;
}

void TaskGrid::build() {
  groups_ = problem_->num_groups();
  const Problem& p = *problem_;
  const auto nb = static_cast<std::int64_t>(sharding_.num_blocks());
  // Grids that could be large are estimated against the memory budget before
  // they are built (small ones skip the estimate's pass over the slices).
  if (nb * nb * problem_->num_groups() > (std::int64_t{1} << 20)) {
    const ResourceEstimate est = estimate_resources(*problem_, sharding_);
    check_resources(*problem_, est, default_memory_budget());
  }
  total_task_area_ = 0;
  const int selection_heads = p.index_mask      ? p.index_mask->kv_heads
                              : p.index_summary ? p.index_summary->kv_heads
                                                : static_cast<int>(p.head_masks.size());
  per_group_ = selection_heads > 1;
  if (per_group_ && !flattened())
    throw Error(fmt::format("task grid: the mask selects per KV head ({} heads), which needs flattened head groups "
                            "(problem.grid.flatten_head_groups: true)",
                            selection_heads));
  if (per_group_ && selection_heads != groups_)
    throw Error(fmt::format("task grid: the mask selects for {} KV heads but the problem has {} (heads.kv); a "
                            "selection is per KV head or shared (1)",
                            selection_heads, groups_));

  // One cell list per head group (or one shared by all).
  std::vector<std::vector<Cell>> per(per_group_ ? static_cast<std::size_t>(groups_) : 1);
  Token area = 0;
  if (p.index_topk()) {
    IndexCountOptions o;
    o.per_head = per_group_;
    std::vector<IndexCell> counted;
    if (p.index_mask) counted = count_index_cells(*p.index_mask, sharding_.blocks, o);
    else if (p.index_summary->blocks == sharding_.blocks) counted = p.index_summary->cells;
    else counted = coarsen_index_cells(p.index_summary->cells, p.index_summary->blocks, sharding_.blocks);
    for (IndexCell& c : counted) {
      if (__builtin_add_overflow(area, c.area, &area))
        throw LimitError("mask", "task grid: the mask area does not fit 64 bits");
      per[static_cast<std::size_t>(c.head)].push_back(
          Cell{c.qblock, c.kblock, c.area, std::move(c.rows), std::move(c.cols), {}});
    }
  } else if (per_group_) {
    for (int g = 0; g < groups_; ++g) per[static_cast<std::size_t>(g)] = cells_of(p.head_masks[static_cast<std::size_t>(g)].slices(), area);
  } else {
    per[0] = cells_of(p.mask.slices(), area);
  }

  if (!per_group_) {
    cells_ = std::move(per[0]);
    add_cell_count(cells_.size());
    if (__builtin_mul_overflow(area, groups_, &total_task_area_))
      throw LimitError("mask", "task grid: the mask area does not fit 64 bits");
    return;
  }
  // Per-group cells: the union of the groups' block pairs, each task its own cell.
  total_task_area_ = area;
  std::vector<Cell> all;
  for (const auto& v : per)
    for (const Cell& c : v) all.push_back(Cell{c.qblock, c.kblock, 0, {}, {}, {}});
  std::sort(all.begin(), all.end(), by_blocks);
  all.erase(std::unique(all.begin(), all.end(), [](const Cell& a, const Cell& b) {
              return a.qblock == b.qblock && a.kblock == b.kblock;
            }), all.end());
  add_cell_count(all.size());
  cells_ = std::move(all);
  group_cells_.assign(cells_.size() * static_cast<std::size_t>(groups_), Cell{});
  for (std::size_t c = 0; c < cells_.size(); ++c)
    for (int g = 0; g < groups_; ++g) {
      Cell& x = group_cells_[c * static_cast<std::size_t>(groups_) + static_cast<std::size_t>(g)];
      x.qblock = cells_[c].qblock;
      x.kblock = cells_[c].kblock;
    }
  for (int g = 0; g < groups_; ++g) {
    std::size_t c = 0;
    for (Cell& x : per[static_cast<std::size_t>(g)]) {
      while (by_blocks(cells_[c], x)) ++c;
      Cell& u = cells_[c];
      u.area += x.area;
      u.rows = u.rows.unite(x.rows);
      u.cols = u.cols.unite(x.cols);
      group_cells_[c * static_cast<std::size_t>(groups_) + static_cast<std::size_t>(g)] = std::move(x);
    }
  }
}

const SelectionRows& TaskGrid::selection() const {
  if (problem_->index_summary) {  // this rank's rows (Problem::make of a summary)
    if (problem_->index_row_runs)
      throw Error("task grid: the problem holds its rank's row runs, not its rows: its plan's index rows are the "
                  "executor's to write (CalcMeta::deferred_index_entries)");
    if (!problem_->selection_rows || problem_->selection_rows->made() == nullptr)
      throw Error("task grid: a problem of index summaries without its rank's rows (make it with Problem::make)");
    return *problem_->selection_rows->made();
  }
  if (!problem_->index_mask) throw Error("task grid: selection() of a grid without an index mask");
  return (problem_->selection_rows ? *problem_->selection_rows : own_selection_).get(*problem_->index_mask);
}

}  // namespace cpsched
