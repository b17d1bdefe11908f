#include "kernel_pick.hpp"

#include <algorithm>
#include <tuple>

namespace cpsched::search {

PlanPricing::Placement AreasFirstPricing::add(std::shared_ptr<const TaskGrid> grid, std::vector<Rank> rank) {
  const Placement h = host_.add(grid, rank);
  std::lock_guard<std::mutex> lock(mu_);
  if (h >= placed_.size()) placed_.resize(h + 1);
  if (!placed_[h].grid)
    placed_[h] = {h, std::move(grid), std::make_unique<const std::vector<Rank>>(std::move(rank))};
  return h;
}

PlanPrices AreasFirstPricing::price_both(Placement p, const PlanShape& shape) {
  const PlanPrices both = host_.price_both(p, shape);
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto key = std::make_pair(p, shape);
    if (std::find(keys_.begin(), keys_.end(), key) == keys_.end()) {
      keys_.push_back(key);
      prices_.push_back(both);
    }
  }
  return {both.areas, both.areas};
}

std::optional<AreasFirstPricing::Priced> AreasFirstPricing::fastest_on_kernels(
    const std::shared_ptr<const TaskGrid>& grid, const std::vector<Rank>& rank, const PlanShape& shape,
    const PlanShape& asked) const {
  std::lock_guard<std::mutex> lock(mu_);
  const PlanShape today_shape = asked.resolve(shape);
  std::optional<std::size_t> today_at;
  for (std::size_t i = 0; i < keys_.size() && !today_at; ++i) {
    const Placed& pl = placed_[keys_[i].first];
    if (pl.grid == grid && *pl.rank == rank && keys_[i].second == today_shape)
      today_at = i;
  }
  if (!today_at) return std::nullopt;
  // Fastest first; on equal steps today's, then by shape, grid and
  // placement (not by when each was priced: that depends on the threads).
  auto key = [&](std::size_t i) {
    const PlanShape& s = keys_[i].second;
    return std::make_tuple(prices_[i].kernels.step, i != *today_at, s.stages, s.relay_node_size(),
                           static_cast<int>(s.cut), placed_[keys_[i].first].grid->problem().grid.blocks_per_rank);
  };
  std::size_t best = *today_at;
  for (std::size_t i = 0; i < keys_.size(); ++i) {
    const auto ki = key(i), kb = key(best);
    if (ki < kb || (ki == kb && *placed_[keys_[i].first].rank < *placed_[keys_[best].first].rank)) best = i;
  }
  const Placed& pl = placed_[keys_[best].first];
  return Priced{pl.grid, pl.rank.get(), keys_[best].second, prices_[best], best == *today_at};
}

}  // namespace cpsched::search
