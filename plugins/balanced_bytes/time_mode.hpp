#pragma once
// What the time mode's files share: the search's time prices of a grid under
// a time cost model, and a placement's busiest rank.
#include <cstdint>
#include <vector>

#include <cpsched/plugin/solver.hpp>

#include "cpsched/search/state.hpp"

namespace cpsched::search {

TimeObjective time_objective(const TimePrices& tp, const TaskGrid& grid, double spread);

// The largest load of a rank under `rank` (0 on an empty grid).
std::int64_t max_load(const TaskGrid& g, const std::vector<Rank>& rank);

}  // namespace cpsched::search
