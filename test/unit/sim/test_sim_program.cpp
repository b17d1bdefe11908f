// A changed program is one change: the timing model and the sim both run
// the plan's program (plan/program.hpp), so moving its reduces moves theirs.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "cpsched/base/error.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/plan/program.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/timing/model.hpp"
#include "program_fixtures.hpp"
#include "sim_outcome.hpp"

using namespace cpsched;
using test::early_reduce_plan;
using test::reduces_at_end;
using test::Fixture;

namespace {

HardwareProfile profile() {
  HardwareProfile hw;
  hw.name = "test";
  hw.fwd_tflops = 100;
  hw.bwd_tflops = 50;
  hw.gpus_per_node = 8;
  hw.intra_node = {200, 5};
  hw.inter_node = {25, 20};
  hw.overlap = true;
  return hw;
}

}  // namespace

TEST_CASE("a changed program is one change: the timing model and the sim both follow it") {
  Fixture f = early_reduce_plan();
  const int N = f.plan.num_stages;
  Plan late = f.plan;
  for (RankPlan& r : late.ranks) {
    r.fwd.program = reduces_at_end(r.fwd.program);
    r.bwd.program = reduces_at_end(r.bwd.program);
  }
  REQUIRE(late.ranks[0].bwd.program != f.plan.ranks[0].bwd.program);
  const Problem& p = f.a.grid->problem();
  const HardwareProfile hw = profile();

  // The timing model: every reduce now follows the last stage, and the step
  // moves with them.
  auto reduce_points = [&](const Plan& plan) {
    std::vector<int> at;
    for (const RankTimeline& r : simulate_pass(p, plan, hw, Pass::bwd).ranks)
      for (const TimedOp& op : r.comm)
        if (op.kind == OpKind::reduce) at.push_back(op.stage);
    return at;
  };
  const std::vector<int> before = reduce_points(f.plan), after = reduce_points(late);
  REQUIRE(!after.empty());
  CHECK(std::any_of(before.begin(), before.end(), [&](int s) { return s < N; }));
  CHECK(std::all_of(after.begin(), after.end(), [&](int s) { return s == N; }));
  CHECK(estimate_step(p, late, hw).step() != estimate_step(p, f.plan, hw).step());

  // The sim: it runs the changed program, instruction for instruction, and
  // the results still equal the reference.
  const sim::GlobalInputs in = sim::GlobalInputs::generate(p, 11);
  const sim::VirtualRun run = sim::run_virtual_ranks(p, late, in, 2);
  CHECK(run.ran[0] == late.ranks[0].fwd.program);
  CHECK(run.ran[1] == late.ranks[0].bwd.program);
  const test::Outcome o = test::run_numeric(p, late);
  INFO(o.str());
  CHECK(o.passed());

  // A program that reduces too early is refused, not run.
  Plan early = f.plan;
  for (RankPlan& r : early.ranks) std::reverse(r.bwd.program.begin(), r.bwd.program.end());
  CHECK_THROWS_WITH_AS(estimate_step(p, early, hw), doctest::Contains("program"), Error);
  CHECK(!sim::run_virtual_ranks(p, early, in, 2).faults.empty());
}
