#pragma once
// What the time mode's files share: the search's time prices of a grid under
// a time cost model, a placement's busiest rank, and the search's helpers.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cpsched/plugin/solver.hpp>

#include "balanced_bytes.hpp"
#include "cpsched/search/state.hpp"

namespace cpsched::search {

// The time objective's default effort (move evaluations per solve up to 256 tasks).
inline constexpr std::int64_t kTimeEffort = 10000;
// Searching a member's own grid (static's dispatch is 8 x finer) costs about
// its task count; beyond this only the member's plan as it is is priced.
inline constexpr TaskId kMemberGridSearchTasks = 400000;
// The balance cap of the time mode's second full solve on one node
// (docs/bounds.md#the-default-solvers-phase-constants).
inline constexpr double kTighterMu = 1.03;

// `v` printed by `fmt` (a figure in a note).
std::string num(double v, const char* fmt = "%.6g");

// a strictly better than b: meeting the cap first, then less load above it,
// then a lower objective.
bool better(const Candidate& a, const Candidate& b);

// Whether `g` is the sequential sharding of its problem's blocks per rank.
bool is_sequential(const TaskGrid& g);
// The same problem sharded sequentially into `blocks_per_rank` blocks per rank.
std::shared_ptr<const TaskGrid> finer_grid(const TaskGrid& g, int blocks_per_rank);

// The search's time prices of `grid` under a time cost model (one rank's
// predicted time each; the used-few-times path's model).
TimeObjective time_objective(const TimePrices& tp, const TaskGrid& grid, double spread);

// The full search's: the same, except across nodes in the fixed layout, where
// the tails of long documents must cross the NICs: there it predicts the
// coupled step (TimeObjective::coupled), which the per-rank model let the
// search dodge by loading one rank's ports and another's compute, and prices
// relays (TimeObjective::relays) where the plans priced may have them
// (docs/bounds.md#the-fixed-layout). Only on grids of at most `priced_tasks`
// tasks, whose candidates the timing model judges: above, the prediction alone
// picks, and the per-rank one is what was measured there.
TimeObjective full_search_objective(const SolveInput& in, const TaskGrid& grid, double spread, TaskId priced_tasks);

// The node size relays span under plan.relay auto: the host's node size, else
// the time prices'; 0 where the ranks fit in one such node (nothing to relay).
int auto_relay_node(const SolveInput& in);

// The largest load of a rank under `rank` (0 on an empty grid).
std::int64_t max_load(const TaskGrid& g, const std::vector<Rank>& rank);
// The load above `cap`, summed over the ranks (State::excess without a State).
std::int64_t excess_load(const TaskGrid& g, const std::vector<Rank>& rank, std::int64_t cap);

}  // namespace cpsched::search
