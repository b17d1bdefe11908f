// The same input, layout and uses give the same plan, whatever the thread
// count of the solver (its own workers and the binary_greedy member's): no
// decision depends on scheduling or a wall clock.
#include <doctest/doctest.h>

#include <string>

#include "cpsched/io/plan_json.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/session/session.hpp"
#include "test_helpers.hpp"

using namespace cpsched;

namespace {

std::string plan_of(const std::shared_ptr<Registry>& reg, const std::string& solver, const std::string& cost,
                    Layout layout, PlanUses uses, int threads, const RangeMask& mask) {
  SessionOptions o;
  o.cp_size = 16;
  o.heads = {16, 4, 64, 2};
  o.solver = solver;
  o.solver_params.set("threads", std::int64_t{threads});
  o.cost_model = cost;
  if (cost == "time") o.cost_params.set("hardware", std::string("cluster_8gpu_ib"));
  o.layout = layout;
  o.uses = uses;
  o.plan.stages = PlanShape::kAutoStages;
  o.plan.relay = PlanShape::Relay::automatic;
  o.plan.node_size = 8;
  Session s(o, reg);
  const SolveResult& r = s.solve(mask);
  PlanExport e;  // without the wall times
  e.assignment = r.assignment.get();
  e.metrics = &r.metrics;
  e.plan = r.plan.get();
  return plan_json(e, -1);
}

}  // namespace

TEST_CASE("the same input, layout and uses give the same plan at 1, 2 and 8 threads") {
  const auto reg = test::new_build_registry();
  int compared = 0;
  for (const MaskKind kind : {MaskKind::causal_document, MaskKind::full_document, MaskKind::sliding_window}) {
    MaskSpec spec;
    spec.kind = kind;
    spec.seed = 3;
    spec.window_left = 700;
    spec.lengths = {5000, 900, 12000, 300, 6000, 8568};
    const RangeMask mask = make_mask(spec, 16 * 2048);
    for (const auto& [solver, cost] : {std::pair<std::string, std::string>{"balanced_bytes", "time"},
                                       {"balanced_bytes", "area"}, {"binary_greedy", "area"}})
      for (const Layout layout : {Layout::fixed, Layout::planned})
        for (const PlanUses uses : {PlanUses{1}, PlanUses{8}, PlanUses::ahead()}) {
          CAPTURE(solver);
          CAPTURE(cost);
          CAPTURE(to_string(layout));
          CAPTURE(uses.str());
          const std::string one = plan_of(reg, solver, cost, layout, uses, 1, mask);
          CHECK(plan_of(reg, solver, cost, layout, uses, 2, mask) == one);
          CHECK(plan_of(reg, solver, cost, layout, uses, 8, mask) == one);
          ++compared;
        }
  }
  CHECK(compared == 3 * 3 * 2 * 3);
}
