#pragma once
// Solver: maps the tasks of a grid to ranks. The host hands it the grid, the
// cost model's prices and the plan shape the user asked for, plus two host
// services: the timing model on candidate plans (pricing.hpp, time models
// only) and other solver plugins by name (its members). The solver chooses;
// the host builds and times plans. It returns a Solution: the assignment, the
// plan shape it chose where the input left one open, and named figures.
#include <memory>
#include <optional>
#include <string>

#include "cpsched/base/figures.hpp"
#include "cpsched/plan/shape.hpp"
#include "cpsched/plan/uses.hpp"
#include "cpsched/plugin/cost_model.hpp"
#include "cpsched/plugin/params.hpp"
#include "cpsched/plugin/pricing.hpp"
#include "cpsched/problem/assignment.hpp"

namespace cpsched {

class Solver;

// Solver plugins by spec, through the host's registry (the folders of
// --plugin-path and the config's plugin_paths included).
class SolverFactory {
 public:
  // `spec` is "name" or "name:param=value+param=value" (params.hpp);
  // `fallback` gives values for declared parameters the spec leaves unset
  // (a parameter the plugin does not declare is ignored there). Throws
  // cpsched::Error naming the spec when the plugin is missing or refuses.
  virtual std::unique_ptr<Solver> make(const std::string& spec, const Params& fallback) const = 0;

 protected:
  ~SolverFactory() = default;
};

// What a solver is given. Built with named setters, so that adding a field
// never silently drops it at a call site; a member solver gets a copy with
// another grid (with_grid), keeping everything else.
class SolveInput {
 public:
  SolveInput(std::shared_ptr<const TaskGrid> grid, const CostModel& cost) : grid_(std::move(grid)), cost_(&cost) {}

  SolveInput& with_cost(const CostModel& c) { cost_ = &c; return *this; }
  SolveInput& with_shape(const PlanShape& s) { shape_ = s; return *this; }
  SolveInput& with_uses(const PlanUses& u) { uses_ = u; return *this; }
  SolveInput& with_time_prices(const TimePrices& p) { time_ = p; return *this; }
  SolveInput& with_pricing(PlanPricing* p) { pricing_ = p; return *this; }
  SolveInput& with_solvers(const SolverFactory* f) { solvers_ = f; return *this; }
  SolveInput with_grid(std::shared_ptr<const TaskGrid> g) const {
    SolveInput in(*this);
    in.grid_ = std::move(g);
    return in;
  }

  const std::shared_ptr<const TaskGrid>& grid() const { return grid_; }
  // Per-task prices (area, or seconds under a time model).
  const CostModel& cost() const { return *cost_; }
  // The plan shape asked for; auto parts are the solver's to choose.
  const PlanShape& shape() const { return shape_; }
  // How the plan will be used: what planning time costs beside the step.
  const PlanUses& uses() const { return uses_; }
  // Unit prices in seconds: set when the cost model prices time.
  const std::optional<TimePrices>& time_prices() const { return time_; }
  // The host's timing model on candidate plans: set when time_prices is.
  PlanPricing* pricing() const { return pricing_; }
  // Other solver plugins (members): null when the host offers none.
  const SolverFactory* solvers() const { return solvers_; }

 private:
  std::shared_ptr<const TaskGrid> grid_;
  const CostModel* cost_;
  PlanShape shape_;
  PlanUses uses_;
  std::optional<TimePrices> time_;
  PlanPricing* pricing_ = nullptr;
  const SolverFactory* solvers_ = nullptr;
};

struct Solution {
  Assignment assignment;
  // The solver's choice for what the input's shape left open (auto stages,
  // auto relays); the host fills the rest (PlanShape::resolve).
  PlanShape shape;
  bool feasible = true;   // false: the balance target could not be met
  std::string note;       // a remark for people (how it was found); tools read `figures`
  Figures figures;        // e.g. predicted_step_s, compute_bound_s, incumbent_bytes, gap
};

class Solver {
 public:
  virtual ~Solver() = default;
  // May throw; the plugin boundary turns exceptions into an error status.
  virtual Solution solve(const SolveInput& in) = 0;
};

}  // namespace cpsched
