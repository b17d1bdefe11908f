#pragma once
// A solver called the way the host's solve path calls it (SolvePath::solve:
// time prices, the pricing service and the build's registry for members),
// for tests that look at the Solution itself.
#include <memory>

#include "cpsched/plan/builder.hpp"
#include "cpsched/session/solve_path.hpp"
#include "cpsched/timing/model.hpp"
#include "test_helpers.hpp"

namespace cpsched::test {

// The plan shape in the old integer spelling: stages 0 = auto; relay -1 =
// auto, 0 = off, n >= 2 = on nodes of n.
inline PlanShape shape(int stages, int relay = 0) {
  PlanShape s;
  s.stages = stages;
  if (relay < 0) s.relay = PlanShape::Relay::automatic;
  else if (relay >= 2) s = PlanShape{stages, PlanShape::Relay::on, relay};
  return s;
}

inline Solution host_solve(Solver& solver, std::shared_ptr<const TaskGrid> grid, const CostModel& cost,
                           const PlanShape& s = {}) {
  return SolvePath(solver, cost, build_registry()).solve(std::move(grid), s);
}

// The timing model's step of the solution's plan on `cost`'s cluster, at the
// shape the host would build (`asked` resolved by the solver's choice).
inline StepEstimate plan_step(const CostModel& cost, const Solution& sol, const PlanShape& asked = {}) {
  const PlanShape s = asked.resolve(sol.shape);
  return estimate_step(sol.assignment.grid->problem(),
                       build_plan(sol.assignment, PlanOptions{s.stages, s.relay_node_size()}), *cost.hardware());
}

}  // namespace cpsched::test
