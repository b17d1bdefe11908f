#include "cpsched/task_grid.hpp"

#include <algorithm>
#include <unordered_map>

#include <fmt/format.h>

#include "cpsched/limits.hpp"
#include "cpsched/resources.hpp"

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

void TaskGrid::build() {
  groups_ = problem_->num_groups();
  const auto nb = static_cast<std::int64_t>(sharding_.num_blocks());
  // Grids that could be large are estimated against the memory budget before
  // they are built (small ones skip the estimate's pass over the slices).
  if (nb * nb * problem_->num_groups() > (std::int64_t{1} << 20)) {
    const ResourceEstimate est = estimate_resources(*problem_, sharding_);
    check_resources(*problem_, est, default_memory_budget());
  }
  // Cell index by (qblock, kblock): dense table for grids up to 4M cells.
  const bool dense = nb * nb <= (std::int64_t{1} << 22);
  std::vector<std::int32_t> table(dense ? static_cast<std::size_t>(nb * nb) : 0, -1);
  std::unordered_map<std::int64_t, std::int32_t> sparse;
  auto slot = [&](std::int64_t key) -> std::int32_t& {
    if (dense) return table[static_cast<std::size_t>(key)];
    return sparse.try_emplace(key, -1).first->second;
  };

  const auto& blocks = sharding_.blocks;
  total_area_ = 0;
  // Needed rows and cols come from many slices in no particular order:
  // collected per cell and merged once.
  std::vector<RangeSet::Builder> rows, cols;
  for (const Slice& s : problem_->mask.slices()) {
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
          // Cells x groups must index as TaskId (limits.hpp).
          if (static_cast<std::int64_t>(cells_.size() + 1) * groups_ > limits::kMaxTasks)
            throw LimitError("grid.blocks_per_rank",
                             fmt::format("task grid: more than {} tasks ({} cells x {} head groups so far); "
                                         "fewer blocks (problem.grid.blocks_per_rank, problem.cp_size) or a "
                                         "sparser mask fit",
                                         limits::kMaxTasks, cells_.size() + 1, groups_));
          idx = static_cast<std::int32_t>(cells_.size());
          cells_.push_back(Cell{qb, kb, 0, {}, {}, {}});
          rows.emplace_back();
          cols.emplace_back();
        }
        const auto i = static_cast<std::size_t>(idx);
        Cell& c = cells_[i];
        // Checked: a problem built without Problem::validate() may be outside the limits.
        if (__builtin_add_overflow(c.area, a, &c.area) || __builtin_add_overflow(total_area_, a, &total_area_))
          throw LimitError("mask", "task grid: the mask area does not fit 64 bits (limits.hpp: mask area x "
                                   "query heads <= 2^62); call Problem::validate()");
        rows[i].add(slice_needed_rows(s, qr, kr));
        cols[i].add(slice_needed_cols(s, qr, kr));
        c.pieces.push_back(s);
      }
    }
  }
  for (std::size_t i = 0; i < cells_.size(); ++i) {
    cells_[i].rows = rows[i].build();
    cells_[i].cols = cols[i].build();
  }
  std::sort(cells_.begin(), cells_.end(), [](const Cell& a, const Cell& b) {
    return std::pair{a.qblock, a.kblock} < std::pair{b.qblock, b.kblock};
  });
}

}  // namespace cpsched
