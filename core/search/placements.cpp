#include "cpsched/search/placements.hpp"

#include <cmath>

#include <cpsched/metrics.hpp>

namespace cpsched::search {

std::vector<Rank> owner_placement(const TaskGrid& grid) {
  std::vector<Rank> r(static_cast<std::size_t>(grid.num_tasks()));
  for (TaskId t = 0; t < grid.num_tasks(); ++t) r[static_cast<std::size_t>(t)] = grid.q_host(t);
  return r;
}

std::vector<Rank> usp_placement(const TaskGrid& grid, int max_degree) {
  if (!grid.flattened()) return {};
  const int P = grid.cp_size(), G = grid.num_groups();
  const int u = usp_ulysses_degree(P, grid.problem().heads.kv, max_degree);
  std::vector<Rank> r(static_cast<std::size_t>(grid.num_tasks()));
  for (TaskId t = 0; t < grid.num_tasks(); ++t)
    r[static_cast<std::size_t>(t)] = (grid.q_host(t) / u) * u + grid.group_of(t) * u / G;
  return r;
}

std::int64_t balance_cap(const TaskGrid& grid, double mu) {
  // imbalance = max load x P / total <= mu (computed as compute_metrics does,
  // so that a load at the cap never reads as imbalance > mu).
  std::int64_t total_load = 0;
  for (TaskId t = 0; t < grid.num_tasks(); ++t) total_load += grid.load(t);
  const double total = static_cast<double>(total_load);
  const double P = grid.cp_size();
  if (total <= 0) return 0;
  // A cap at or above the whole load constrains nothing (and mu x total / P
  // may not even fit in 64 bits: mu = 1e12 once made this count up forever).
  if (!(mu * total / P < total)) return total_load;
  auto ok = [&](std::int64_t c) { return static_cast<double>(c) * P / total <= mu; };
  auto cap = static_cast<std::int64_t>(std::floor(mu * total / P));
  // Rounding moves the answer by a few units at most.
  for (int i = 0; i < 64 && cap > 0 && !ok(cap); ++i) --cap;
  for (int i = 0; i < 64 && cap < total_load && ok(cap + 1); ++i) ++cap;
  return cap;
}

}  // namespace cpsched::search
