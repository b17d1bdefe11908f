#pragma once
// Solver: maps the tasks of a grid to ranks.
#include <memory>

#include "cpsched/problem/assignment.hpp"
#include "cpsched/plugin/cost_model.hpp"

namespace cpsched {

struct SolveInput {
  std::shared_ptr<const TaskGrid> grid;
  const CostModel* cost = nullptr;  // never null when called by the host
  // Remote stages of the plan the host will build: N >= 1, or 0 for `auto`
  // (the solver may choose, and says so in Assignment::stages).
  int stages = 1;
  // Relays (two-level collectives, PlanOptions::relay_node_size) of that plan:
  // 0 none, n >= 2 on nodes of n ranks, or -1 for `auto` (the solver may
  // choose, and says so in Assignment::relay_node_size).
  int relay = 0;
};

class Solver {
 public:
  virtual ~Solver() = default;
  // May throw; the plugin boundary turns exceptions into error status.
  virtual Assignment solve(const SolveInput& in) = 0;
};

}  // namespace cpsched
