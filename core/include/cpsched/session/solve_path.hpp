#pragma once
// The host's one path from a problem to a plan:
//   grid -> solve -> plan shape -> build once -> metrics -> validate
// Session, the command-line tool, compare, the Python module and the
// benchmarks all call it; nothing else strings these steps together.
#include <memory>
#include <optional>
#include <string>

#include "cpsched/base/buffer_recycler.hpp"
#include "cpsched/plan/plan.hpp"
#include "cpsched/plan/solve_result.hpp"
#include "cpsched/plan/shape.hpp"
#include "cpsched/plugin/registry.hpp"
#include "cpsched/plugin/solver.hpp"
#include "cpsched/problem/metrics.hpp"

namespace cpsched {

// The use a plan is assumed to have when nobody says: a fixed layout's plan
// is made for one call (per layer, online), a planned layout's ahead of need
// (in the data loader).
PlanUses default_uses(Layout layout);

class SolvePath {
 public:
  // `registry` serves the solver's members (SolveInput::solvers); it and the
  // solver and cost model must outlive the path.
  SolvePath(Solver& solver, const CostModel& cost, const Registry& registry);
  ~SolvePath();

  struct Options {
    PlanShape shape;
    // nullopt: by the problem's layout (fixed: 1, planned: ahead).
    std::optional<PlanUses> uses;
    bool validate = false;  // run the plan validator (throws cpsched::Error listing its problems)
    // >= 0: build this rank's plan only (PlanOptions::rank), what each rank
    // of a run needs; the solve is the same on every rank (deterministic).
    // Metrics stay those of the whole assignment.
    Rank rank = -1;
    std::string solver_name = "solver";  // for messages
    BufferRecycler* buffers = nullptr;   // the index pools' buffers (PlanOptions::buffers)
  };
  // Builds the grid of `problem`, solves it, resolves the plan shape, builds
  // the plan once (from the pricing's transfers where the solver priced it)
  // and measures it. Throws cpsched::Error.
  SolveResult run(std::shared_ptr<const Problem> problem, const Options& options) const;
  // The same problem's grid given (a caller that built it).
  SolveResult run(std::shared_ptr<const TaskGrid> grid, const Options& options) const;
  // The solve step alone, on the input run() would give the solver: its
  // Solution as returned (validated), for callers that need no plan (tests,
  // the members' benchmarks).
  Solution solve(std::shared_ptr<const TaskGrid> grid, const PlanShape& shape,
                 std::optional<PlanUses> uses = std::nullopt) const;
  // Another plan of a solve's assignment, at another shape (compare's stage
  // sweep: one solve, several stage counts); auto parts resolve against the
  // solve's own shape.
  std::shared_ptr<const Plan> replan(const SolveResult& result, const PlanShape& shape) const;

  const CostModel& cost() const { return cost_; }

 private:
  struct Solved;
  Solved solve_step(std::shared_ptr<const TaskGrid> grid, const PlanShape& shape, std::optional<PlanUses> uses) const;
  Solver& solver_;
  const CostModel& cost_;
  std::unique_ptr<RegistrySolvers> factory_;
};

}  // namespace cpsched
