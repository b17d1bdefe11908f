#include "cpsched/base/stopwatch.hpp"
#include "cpsched/session/solve_path.hpp"

#include <chrono>

#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/plan/validator.hpp"
#include "cpsched/pricing/host_pricing.hpp"
#include "cpsched/problem/resources.hpp"
#include "cpsched/timing/model.hpp"

namespace cpsched {

namespace {

// The node size that relays (on or auto) group by when the shape leaves it
// open: the cost model's cluster, else the default profile's.
PlanShape with_node_size(PlanShape s, const CostModel& cost) {
  if (s.relay != PlanShape::Relay::off && s.node_size == 0) {
    const HardwareProfile* hw = cost.hardware();
    s.node_size = hw != nullptr ? hw->gpus_per_node : resolve_hardware_profile(kDefaultHardwareProfile).gpus_per_node;
  }
  return s;
}

}  // namespace

PlanUses default_uses(Layout layout) { return layout == Layout::planned ? PlanUses::ahead() : PlanUses{1}; }

SolvePath::SolvePath(Solver& solver, const CostModel& cost, const Registry& registry)
    : solver_(solver), cost_(cost), factory_(std::make_unique<RegistrySolvers>(registry)) {}

SolvePath::~SolvePath() = default;

SolveResult SolvePath::run(std::shared_ptr<const Problem> problem, const Options& o) const {
  if (!problem) throw Error("solve path: no problem given");
  // Grid, plan (index pools included) and, when asked, the validator against
  // the memory budget, before any of them is built (base/resources.hpp).
  check_resources(*problem, /*sim_numeric=*/false, o.validate);
  const auto t0 = Clock::now();
  auto grid = std::make_shared<const TaskGrid>(std::move(problem));
  const double grid_ms = ms_since(t0);
  SolveResult r = run(std::move(grid), o);
  r.grid_ms = grid_ms;
  return r;
}

struct SolvePath::Solved {
  PlanShape asked;                       // the shape with its node size filled in
  PlanUses uses;                         // resolved
  Solution solution;
  std::unique_ptr<HostPricing> pricing;  // what pricing built, for the plan
  double solve_ms = 0;
};

SolvePath::Solved SolvePath::solve_step(std::shared_ptr<const TaskGrid> grid, const PlanShape& shape,
                                        std::optional<PlanUses> uses) const {
  if (!grid) throw Error("solve path: no grid given");
  Solved s;
  s.asked = with_node_size(shape, cost_);
  s.uses = uses ? *uses : default_uses(grid->problem().layout);
  s.uses.validate("solve path");
  SolveInput in(std::move(grid), cost_);
  in.with_shape(s.asked).with_uses(s.uses).with_solvers(factory_.get());
  if (const HardwareProfile* hw = cost_.hardware()) {
    in.with_time_prices(time_prices(*hw));
    s.pricing = std::make_unique<HostPricing>(*hw);
    in.with_pricing(s.pricing.get());
  }
  const auto t0 = Clock::now();
  const Problem& problem = in.grid()->problem();
  s.solution = solver_.solve(in);
  s.solve_ms = ms_since(t0);
  s.solution.assignment.validate();
  if (problem.layout == Layout::fixed && !s.solution.assignment.grid->sharding().same_layout(problem.sharding))
    throw Error("solve path: the solver re-laid out the tokens, but problem.layout is fixed (the tokens stay where "
                "the caller holds them); use problem.layout: planned, or a solver that keeps the layout");
  return s;
}

Solution SolvePath::solve(std::shared_ptr<const TaskGrid> grid, const PlanShape& shape,
                          std::optional<PlanUses> uses) const {
  shape.validate("solve path");
  return solve_step(std::move(grid), shape, uses).solution;
}

SolveResult SolvePath::run(std::shared_ptr<const TaskGrid> grid, const Options& o) const {
  o.shape.validate(o.solver_name);
  Solved s = solve_step(std::move(grid), o.shape, o.uses);
  Solution& sol = s.solution;
  SolveResult r;
  r.solver = o.solver_name;
  r.uses = s.uses;
  r.solve_ms = s.solve_ms;
  const auto t0 = Clock::now();
  r.shape = s.asked.resolve(sol.shape);
  auto a = std::make_shared<const Assignment>(std::move(sol.assignment));
  // The chosen placement's transfers and send orders, where pricing made them.
  std::unique_ptr<PlanBuilder> own;
  const PlanBuilder* builder = s.pricing ? s.pricing->builder_of(*a) : nullptr;
  if (builder == nullptr) builder = (own = std::make_unique<PlanBuilder>(*a)).get();
  PlanOptions po{r.shape.stages, r.shape.relay_node_size()};
  po.hardware = cost_.hardware();
  if (po.hardware != nullptr) po.stage_cut = r.shape.cut;  // (a cut is chosen on a profile)
  po.timer = &timing_model_timer();
  po.rank = o.rank;
  po.buffers = o.buffers;
  r.plan = std::make_shared<const Plan>(builder->build(po));
  if (po.hardware != nullptr) r.hardware = std::make_shared<const HardwareProfile>(*po.hardware);
  // The cut the plan took, resolved: a rank that builds its own plan from
  // this shape (replan, the compare's rank paths) need not price both again.
  if (r.shape.cut == PlanShape::Cut::automatic) r.shape.cut = builder->cut_of(po);
  r.metrics = builder->metrics();
  r.plan_ms = ms_since(t0);
  s.pricing.reset();
  own.reset();
  r.assignment = std::move(a);
  r.feasible = sol.feasible;
  r.note = std::move(sol.note);
  r.figures = std::move(sol.figures);
  if (o.validate) {  // (a rank's plan against its peers)
    const std::vector<std::string> problems = validate_result(r);
    if (!problems.empty()) {
      std::string msg = fmt::format("solve path: the plan of solver '{}' is invalid:", o.solver_name);
      for (const auto& p : problems) msg += "\n  " + p;
      throw Error(msg);
    }
  }
  return r;
}

std::shared_ptr<const Plan> SolvePath::replan(const SolveResult& result, const PlanShape& shape) const {
  if (!result.assignment) throw Error("solve path: replan of an empty result");
  const PlanShape s = with_node_size(shape, cost_).resolve(result.shape);
  PlanOptions po{s.stages, s.relay_node_size()};
  po.hardware = cost_.hardware();
  if (po.hardware != nullptr) po.stage_cut = s.cut;
  po.timer = &timing_model_timer();
  return std::make_shared<const Plan>(build_plan(*result.assignment, po));
}

}  // namespace cpsched
