#pragma once
// A lower bound on the timing model's step time (timing.hpp) of any plan
// built from a placement, at any stage count, computed from the placement's
// transfers without building the plan. Solvers that price candidate plans
// skip a build whose bound already reaches the fastest plan priced so far:
// the skipped plan cannot be faster, so the choice is the same as pricing all.
//
// Per pass, every rank's compute stream runs all its args, and its comm
// stream runs its collectives one after another, each at least as long as
// every port time of the rank in it (latency + bytes / bandwidth). So
//     pass >= max over ranks r of max(compute_r,
//                                     max over link classes c of port_r,c)
// where port_r,c is the larger of the bytes r sends and receives on class c
// in the pass (casts and reduces), times seconds per byte, plus one latency
// when there are any. step >= forward bound + backward bound. The HBM
// kernels (pack, unpack, merge) only add to this.
//
// With relays the NIC bytes move between ranks of a node, so only the
// compute term is a bound there (`relayed`).
#include <vector>

#include "cpsched/plugin/cost_model.hpp"
#include "cpsched/plugin/pricing.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/problem/task_grid.hpp"

namespace cpsched {

// (StepBound is plugin/pricing.hpp's: what the pricing service reports.
// may_forward is about relays on nodes of `relay_node_size` ranks.)
// `transfers`: the placement's (PlanBuilder::transfers or metrics' transfers()).
StepBound step_lower_bound(const TaskGrid& grid, const std::vector<Rank>& rank, const std::vector<Transfer>& transfers,
                           const TimePrices& prices, int relay_node_size);

}  // namespace cpsched
