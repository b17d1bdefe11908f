#pragma once
// Programs (plan/program.hpp) changed the way the tests change them, and a
// plan whose change shows.
#include <algorithm>
#include <random>

#include "cpsched/plan/builder.hpp"
#include "cpsched/plan/program.hpp"
#include "plan_fixtures.hpp"
#include "random_specs.hpp"

namespace cpsched::test {

// Every reduce waits for the last stage (always allowed: a later reduce
// still sees every contribution).
inline Program reduces_at_end(const Program& p) {
  Program out, reduces;
  for (const Instr& i : p) (i.op == Op::reduce ? reduces : out).push_back(i);
  const auto at = std::find_if(out.begin(), out.end(), [](const Instr& i) { return i.op == Op::wait_reduces; });
  out.insert(at, reduces.begin(), reduces.end());
  return out;
}

// A plan of three stages whose reduce points are not all the last stage.
struct Fixture {
  Assignment a;
  Plan plan;
};
inline Fixture early_reduce_plan() {
  std::mt19937_64 rng(7);
  for (int attempt = 0; attempt < 200; ++attempt) {
    auto grid = random_grid(MaskKind::causal_document, 6, Heads{4, 2, 8, 2}, rng);
    Assignment a = random_assignment(grid, rng);
    PlanOptions o;
    o.stages = 3;
    Plan plan = build_plan(a, o);
    for (const StageComm& sc : plan.ranks[0].bwd.comm.stages)
      if ((sc.qo_reduce_after > 0 && sc.qo_reduce_after < plan.num_stages) ||
          (sc.kv_reduce_after > 0 && sc.kv_reduce_after < plan.num_stages))
        return {std::move(a), std::move(plan)};
  }
  FAIL("no random plan reduces before its last stage");
  return {};
}

}  // namespace cpsched::test
