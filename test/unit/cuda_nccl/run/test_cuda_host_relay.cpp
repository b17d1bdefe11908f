// Relays in the CUDA runtime's host translation: forwarding phases are
// carried (plan blobs, wire calls that pair up) and executed by the exact GPU
// pipeline in its CPU emulation, checked against the sim runtime.
#include <doctest/doctest.h>

#include <random>

#include "brute_force.hpp"
#include "cpsched/plan/builder.hpp"
#include "host/plan/plan_codec.hpp"
#include "host/plan/transfers.hpp"
#include "host/run/check.hpp"
#include "host/run/emulate.hpp"
#include "host/run/inputs.hpp"
#include "plans.hpp"

using namespace cpsched;
namespace g = cpsched::gpu;

namespace {

// The runtime tests' random placement, planned with relays on nodes of `node` ranks.
test::PlanCase relay_case(RangeMask mask, int P, int node, int dim, bool flat, int stages, std::uint64_t seed) {
  test::PlanCase c = test::make_plan_case(std::move(mask), P, Heads{4, 2, dim, 2}, GridOptions{flat, 1}, stages, seed);
  c.plan = build_plan(c.assignment, PlanOptions{stages, node});
  return c;
}

g::CheckResult run_and_check(const test::PlanCase& c, g::Schedule s) {
  const g::HeadLayout h = g::HeadLayout::of(*c.problem);
  std::vector<g::RankInputs> in;
  for (Rank r = 0; r < c.plan.sharding.cp_size; ++r) in.push_back(g::shard_inputs(*c.problem, c.plan.sharding, r, 7));
  const g::EmulatedRun run = g::emulate(c.plan, h, in, s);
  return g::check_against_sim(*c.problem, c.plan, run.outputs, 7, g::kDefaultTolerance, 2);
}

}  // namespace

TEST_CASE("relayed plans: the emulated pipeline matches the sim runtime") {
  std::mt19937_64 rng(808);
  struct Case {
    int P, node, stages, dim;
    bool flat;
    std::uint64_t placement;
  };
  const Case cases[] = {{4, 2, 1, 16, true, 3}, {4, 2, 2, 16, false, 5}, {6, 2, 2, 32, true, 0},
                        {8, 4, 1, 16, true, 11}, {8, 4, 3, 16, true, 0}};
  int relayed = 0;
  for (const Case& k : cases) {
    const Token S = 64 * k.P + static_cast<Token>(rng() % 64);
    // Causal masks: most blocks are read by several ranks of each node.
    RangeMask mask = k.P == 6 ? test::random_document_mask(S, rng) : test::generated_mask(MaskKind::causal, S);
    auto c = relay_case(std::move(mask), k.P, k.node, k.dim, k.flat, k.stages, k.placement);
    relayed += c.plan.has_forwarding() ? 1 : 0;
    for (g::Schedule s : {g::Schedule::eager, g::Schedule::lazy_comm, g::Schedule::lazy_compute}) {
      const g::CheckResult res = run_and_check(c, s);
      INFO("P=", k.P, " node=", k.node, " stages=", k.stages, " D=", k.dim, " flat=", k.flat, ": ", res.text);
      CHECK(res.passed);
      // A relayed partial is rounded to bf16 twice (at the computing rank, then
      // merged at the relay), one rounding more than a direct one.
      CHECK(res.errors.max() < 1e-2);
    }
  }
  CHECK(relayed >= 4);
}

TEST_CASE("relayed plans: every rank's NCCL calls pair up, forwarding phases included; blobs carry them") {
  auto c = relay_case(test::generated_mask(MaskKind::causal, 700), 8, 4, 16, true, 2, 9);
  REQUIRE(c.plan.has_forwarding());
  const g::HeadLayout h = g::HeadLayout::of(*c.problem);
  std::vector<std::vector<g::WireOp>> ops;
  int forwarding_calls = 0;
  for (Rank r = 0; r < 8; ++r) {
    const RankPlan& rp = c.plan.ranks[static_cast<std::size_t>(r)];
    ops.push_back(g::wire_ops(g::translate(rp.fwd, g::Pass::fwd, h, r), g::translate(rp.bwd, g::Pass::bwd, h, r), r));
    for (const g::WireOp& w : ops.back()) forwarding_calls += w.phase >= 2 ? 1 : 0;
    const RankPlan back = g::decode_rank_plan(g::encode_rank_plan(rp, c.plan.num_stages));
    CHECK(back.fwd.comm.stages == rp.fwd.comm.stages);
    CHECK(back.bwd.comm.stages == rp.bwd.comm.stages);
  }
  CHECK(forwarding_calls > 0);
  const auto problems = g::cross_check(ops);
  INFO((problems.empty() ? std::string() : problems.front()));
  CHECK(problems.empty());
  // A relay whose forwarding split reaches past its first-phase rows is refused.
  for (Rank r = 0; r < 8; ++r) {
    PassPlan& pp = c.plan.ranks[static_cast<std::size_t>(r)].fwd;
    for (StageComm& sc : pp.comm.stages)
      if (!sc.kv_fwd.input_ranges.empty()) {
        const Token first = first_phase_tokens(sc.kv);
        sc.kv_fwd.input_ranges[0] = {first, first + sc.kv_fwd.input_split_sizes[0]};
        CHECK_THROWS_WITH(g::translate(pp, g::Pass::fwd, h, r), doctest::Contains("first-phase"));
        return;
      }
  }
  FAIL("no forwarding split found");
}
