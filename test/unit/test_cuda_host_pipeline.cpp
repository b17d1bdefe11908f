// The whole GPU pipeline (pack, group-cast, attention kernels, group-reduce
// with merges and sums, stage ordering) run by the CPU emulation, checked
// against the sim runtime on the same bf16 inputs.
#include <doctest/doctest.h>

#include <random>

#include "brute_force.hpp"
#include "cpsched/error.hpp"
#include "cpsched/mask_generators.hpp"
#include "host/check.hpp"
#include "host/emulate.hpp"
#include "host/inputs.hpp"
#include "host/rank_run.hpp"
#include "plans.hpp"

using namespace cpsched;
namespace g = cpsched::gpu;

namespace {

std::vector<g::RankInputs> inputs_of(const test::PlanCase& c, std::uint64_t seed) {
  std::vector<g::RankInputs> in;
  for (Rank r = 0; r < c.plan.sharding.cp_size; ++r) in.push_back(g::shard_inputs(*c.problem, c.plan.sharding, r, seed));
  return in;
}

g::CheckResult run_and_check(const test::PlanCase& c, g::Schedule s, g::EmulatedRun* out = nullptr) {
  const g::HeadLayout h = g::HeadLayout::of(*c.problem);
  g::EmulatedRun run = g::emulate(c.plan, h, inputs_of(c, 7), s);
  g::CheckResult res = g::check_against_sim(*c.problem, c.plan, run.outputs, 7, g::kDefaultTolerance, 2);
  if (out != nullptr) *out = std::move(run);
  return res;
}

}  // namespace

TEST_CASE("inputs are bf16-exact, seeded, and a shard equals the global tensors at its tokens") {
  auto problem = Problem::make(test::generated_mask(MaskKind::causal, 100), 3, Heads{4, 2, 16, 2});
  const sim::GlobalInputs gi = g::global_inputs(problem, 5);
  const g::RankInputs r1 = g::shard_inputs(problem, problem.sharding, 1, 5);
  const Token first = problem.sharding.rank_tokens(1).ranges().front().begin;
  for (std::size_t i = 0; i < r1.q.size(); ++i)
    REQUIRE(g::bf16_to_float(r1.q[i]) == gi.q[static_cast<std::size_t>(first) * 64 + i]);
  for (std::size_t i = 0; i < r1.v.size(); ++i)
    REQUIRE(g::bf16_to_float(r1.v[i]) == gi.v[static_cast<std::size_t>(first) * 32 + i]);
  CHECK(g::float_to_bf16(gi.d_o[17]) == g::float_to_bf16(g::bf16_to_float(g::float_to_bf16(gi.d_o[17]))));
  CHECK(g::global_inputs(problem, 6).q[0] != gi.q[0]);
}

TEST_CASE("the emulated pipeline matches the sim runtime: ranks, stages, head groups, masks, head dims") {
  std::mt19937_64 rng(4242);
  struct Case {
    int P, stages, dim;
    bool flat;
    std::uint64_t placement;
  };
  const Case cases[] = {{1, 1, 16, true, 0}, {2, 1, 32, true, 3},  {3, 2, 16, true, 9},
                        {4, 2, 16, false, 4}, {4, 3, 16, true, 0}, {3, 1, 64, true, 2}};
  for (const Case& k : cases) {
    const Token S = 96 * k.P + static_cast<Token>(rng() % 64);
    RangeMask mask = k.P % 2 == 0 ? test::random_document_mask(S, rng)
                                  : test::generated_mask(MaskKind::causal_document, S, {S / 2, S / 3, S - S / 2 - S / 3});
    auto c = test::make_plan_case(mask, k.P, Heads{4, 2, k.dim, 2}, GridOptions{k.flat, 1 + k.P % 2}, k.stages,
                                  k.placement);
    const g::CheckResult res = run_and_check(c, g::Schedule::eager);
    INFO("P=", k.P, " stages=", k.stages, " D=", k.dim, " flat=", k.flat, ": ", res.text);
    CHECK(res.passed);
    CHECK(res.errors.max() < 5e-3);
  }
}

TEST_CASE("delaying either stream changes nothing: the event order alone makes the result") {
  std::mt19937_64 rng(17);
  auto c = test::make_plan_case(test::random_document_mask(400, rng), 4, Heads{4, 2, 16, 2}, GridOptions{true, 1}, 2, 21);
  g::EmulatedRun eager, lazy_comm, lazy_compute;
  CHECK(run_and_check(c, g::Schedule::eager, &eager).passed);
  CHECK(run_and_check(c, g::Schedule::lazy_comm, &lazy_comm).passed);
  CHECK(run_and_check(c, g::Schedule::lazy_compute, &lazy_compute).passed);
  for (std::size_t r = 0; r < eager.outputs.size(); ++r) {
    CHECK(eager.outputs[r].o == lazy_comm.outputs[r].o);
    CHECK(eager.outputs[r].dk == lazy_comm.outputs[r].dk);
    CHECK(eager.outputs[r].dq == lazy_compute.outputs[r].dq);
    CHECK(eager.outputs[r].lse == lazy_compute.outputs[r].lse);
  }
  CHECK(eager.kernels > 0);
}

TEST_CASE("a plan missing one remote attention arg fails the self-check") {
  std::mt19937_64 rng(23);
  auto c = test::make_plan_case(test::random_document_mask(300, rng), 3, Heads{4, 2, 16, 2}, GridOptions{true, 1}, 1, 8);
  bool dropped = false;
  for (RankPlan& rp : c.plan.ranks)
    if (!dropped && !rp.fwd.calc.remote_attn_args[0].empty()) {
      rp.fwd.calc.remote_attn_args[0].pop_back();
      dropped = true;
    }
  REQUIRE(dropped);
  const g::CheckResult res = run_and_check(c, g::Schedule::eager);
  CHECK_FALSE(res.passed);
  CHECK(res.text.find("FAILED") != std::string::npos);
}

TEST_CASE("the executor's rank program reports per-rank figures and the check on rank 0, for both plan sources") {
  std::mt19937_64 rng(29);
  auto c = test::make_plan_case(test::random_document_mask(320, rng), 3, Heads{4, 2, 16, 2}, GridOptions{true, 1}, 2, 6);
  for (const char* source : {"solve_everywhere", "broadcast"}) {
    Params p;
    p.set("backend", std::string("emulate"));
    p.set("check", true);
    p.set("plan_source", std::string(source));
    p.set("iterations", std::int64_t{2});
    p.set("threads", std::int64_t{2});
    const g::RunOptions opt = g::parse_run_options(p);
    const ExecutionReport rep = g::run_emulated(*c.problem, c.plan, opt, 11);
    INFO(rep.text);
    CHECK(rep.passed);
    CHECK(rep.text.find("self-check against the sim runtime") != std::string::npos);
    CHECK(rep.text.find("passed") != std::string::npos);
    CHECK(rep.text.find(std::string("plan from ") + source) != std::string::npos);
    bool has_rank2 = false;
    for (const auto& [name, v] : rep.figures) has_rank2 = has_rank2 || name == "rank2.fwd_ms";
    CHECK(has_rank2);
  }
}

TEST_CASE("executor parameters are validated with the parameter named") {
  Params p;
  p.set("plan_source", std::string("everywhere"));
  CHECK_THROWS_WITH_AS(g::parse_run_options(p), doctest::Contains("plan_source"), Error);
  Params q;
  q.set("iterations", std::int64_t{0});
  CHECK_THROWS_WITH_AS(g::parse_run_options(q), doctest::Contains("iterations"), Error);
  Params r;
  r.set("launch", std::string("slurm"));
  CHECK_THROWS_WITH_AS(g::parse_run_options(r), doctest::Contains("launch"), Error);
}
