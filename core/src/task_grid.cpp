#include "cpsched/task_grid.hpp"

#include <algorithm>
#include <unordered_map>

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
          idx = static_cast<std::int32_t>(cells_.size());
          cells_.push_back(Cell{qb, kb, 0, {}, {}, {}});
        }
        Cell& c = cells_[static_cast<std::size_t>(idx)];
        c.area += a;
        c.rows.add(slice_needed_rows(s, qr, kr));
        c.cols.add(slice_needed_cols(s, qr, kr));
        c.pieces.push_back(s);
        total_area_ += a;
      }
    }
  }
  std::sort(cells_.begin(), cells_.end(), [](const Cell& a, const Cell& b) {
    return std::pair{a.qblock, a.kblock} < std::pair{b.qblock, b.kblock};
  });
}

}  // namespace cpsched
