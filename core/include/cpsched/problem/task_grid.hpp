#pragma once
// The task grid: the non-empty cells B(i, j) of the (blocks x blocks) grid with
// their exact area and needed rows/cols, and the tasks = cells x head groups.
#include <cstdint>
#include <memory>
#include <vector>

#include "cpsched/mask/index/cells.hpp"
#include "cpsched/problem/problem.hpp"

namespace cpsched {

struct Cell {
  std::int32_t qblock = 0;
  std::int32_t kblock = 0;
  Token area = 0;     // unmasked entries (per head)
  RangeSet rows;      // needed q tokens (global)
  RangeSet cols;      // needed k tokens (global)
  // The mask slices with entries in this cell, unclipped (global coords), in
  // slice order; clipped to the cell's rectangle they give its attention args.
  // Empty for token top-k masks (Problem::index_mask), whose args are index
  // args built from the selection itself.
  std::vector<Slice> pieces;
};

using TaskId = std::int32_t;

class TaskGrid {
 public:
  // Builds the grid of `problem` over its sharding. O(slices + touched cells),
  // or one multi-threaded pass over an index mask's indices.
  // Throws LimitError when the grid would pass limits::kMaxTasks, or when a
  // large one (blocks^2 x groups > 2^20) is estimated (resources.hpp) to need
  // more than the memory budget with its plan.
  explicit TaskGrid(std::shared_ptr<const Problem> problem);
  // The same mask and heads over another sharding (the static solver's dispatch).
  TaskGrid(std::shared_ptr<const Problem> problem, Sharding sharding);

  const Problem& problem() const { return *problem_; }
  std::shared_ptr<const Problem> problem_ptr() const { return problem_; }
  const Sharding& sharding() const { return sharding_; }
  int cp_size() const { return sharding_.cp_size; }
  int num_groups() const { return groups_; }
  bool flattened() const { return problem_->grid.flatten_head_groups; }

  // The block pairs with work in some head group, sorted by (qblock, kblock).
  // With per-group cells (below) a cell's area is the sum over the groups and
  // its rows and cols their union: read a task's own through cell_of(t).
  const std::vector<Cell>& cells() const { return cells_; }
  // Cells x groups, at most limits::kMaxTasks (checked when the grid is built),
  // so the count fits TaskId; task_count() is the same in 64-bit.
  TaskId num_tasks() const { return static_cast<TaskId>(task_count()); }
  std::int64_t task_count() const { return static_cast<std::int64_t>(cells_.size()) * groups_; }
  // Task t is cell t / G in head group t % G (group -1 when not flattened).
  // Head groups see different masks when the problem gives one per KV head
  // (Problem::head_masks, or an index mask with a selection per KV head):
  // then each task has its own cell (area 0 where its group selects nothing
  // in the block pair; such a task computes nothing and moves nothing).
  const Cell& cell_of(TaskId t) const {
    return per_group_ ? group_cells_[static_cast<std::size_t>(t)] : cells_[static_cast<std::size_t>(t / groups_)];
  }
  bool per_group_cells() const { return per_group_; }
  // Token top-k mask: args are index args (Problem::index_mask), built from
  // its sorted rows (made on first use, thread safe).
  bool index_cells() const { return problem_->index_topk(); }
  const SelectionRows& selection() const;
  int group_of(TaskId t) const { return flattened() ? t % groups_ : -1; }
  Token area(TaskId t) const { return cell_of(t).area; }
  Rank q_host(TaskId t) const { return sharding_.host[cell_of(t).qblock]; }
  Rank k_host(TaskId t) const { return sharding_.host[cell_of(t).kblock]; }
  bool is_local(TaskId t) const { return q_host(t) == k_host(t); }

  Token total_area() const { return total_task_area_ / groups_; }  // per head group (the mean with per-group cells)
  Token total_task_area() const { return total_task_area_; }
  // Compute load of a task: area x query heads of the task. Any sum of loads
  // fits int64: the total is at most limits::kMaxLoad (Problem::validate).
  std::int64_t load(TaskId t) const { return area(t) * problem_->q_heads_per_task(); }
  std::int64_t total_load() const { return total_task_area_ * problem_->q_heads_per_task(); }

 private:
  void build();
  std::vector<Cell> cells_of(const std::vector<Slice>& slices, Token& total) const;
  void add_cell_count(std::size_t cells);
  std::shared_ptr<const Problem> problem_;
  Sharding sharding_;
  int groups_ = 1;
  bool per_group_ = false;
  std::vector<Cell> cells_;
  std::vector<Cell> group_cells_;  // per-group cells: [cell * G + group]
  SelectionRowsCache own_selection_;  // when the problem has no shared cache (built by hand)
  Token total_task_area_ = 0;
};

}  // namespace cpsched
