#pragma once
// What one solve produced (SolvePath::run): the assignment, its plan and
// metrics, and what the solver said. Immutable once made; the plan cache
// shares it.
#include <memory>
#include <string>

#include "cpsched/base/figures.hpp"
#include "cpsched/plan/plan.hpp"
#include "cpsched/plan/shape.hpp"
#include "cpsched/plan/uses.hpp"
#include "cpsched/problem/assignment.hpp"
#include "cpsched/problem/metrics.hpp"

namespace cpsched {

struct HardwareProfile;  // hardware/profile.hpp

struct SolveResult {
  std::shared_ptr<const Assignment> assignment;
  std::shared_ptr<const Plan> plan;
  Metrics metrics;
  // The plan's shape, resolved (N stages, relays on or off, and on a
  // profile the stage cut the plan took: SolvePath names it, so that
  // rebuilding the plan chooses nothing and needs no timer).
  PlanShape shape;
  // The cluster the plan was built on (the cost model's profile; null:
  // none): with the shape, what rebuilding its peers needs (validate_result).
  std::shared_ptr<const HardwareProfile> hardware;
  PlanUses uses;         // what the solver was told of its use
  bool feasible = true;  // the solver's balance target was met
  std::string solver;    // the solver that made it (SolvePath::Options::solver_name)
  std::string note;      // the solver's remark, for people
  Figures figures;       // the solver's named figures, for tools
  double grid_ms = 0;    // wall times of the original solve's steps
  double solve_ms = 0;
  double plan_ms = 0;    // the plan build and its metrics
};

}  // namespace cpsched
