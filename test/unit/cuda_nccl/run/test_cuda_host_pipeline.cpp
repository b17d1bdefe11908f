// The whole GPU pipeline (pack, group-cast, attention kernels, group-reduce
// with merges and sums, stage ordering) run by the CPU emulation, checked
// against the sim runtime on the same bf16 inputs.
#include <doctest/doctest.h>

#include <cmath>
#include <fmt/format.h>
#include <limits>
#include <random>

#include "brute_force.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/timing/model.hpp"
#include "host/backend/host_backend.hpp"
#include "host/run/check.hpp"
#include "host/run/emulate.hpp"
#include "host/run/inputs.hpp"
#include "host/run/rank_run.hpp"
#include "plans.hpp"
#include "virtual_ranks.hpp"

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

TEST_CASE("the kernel model's predicted compute of each rank and pass is reported beside the measured times") {
  std::mt19937_64 rng(29);
  auto c = test::make_plan_case(test::random_document_mask(320, rng), 3, Heads{4, 2, 16, 2}, GridOptions{true, 1}, 2, 6);
  Params p;
  p.set("backend", std::string("emulate"));
  p.set("hardware", std::string("h200_8x_nvlink"));
  p.set("compute_timing", true);
  const ExecutionReport rep = g::run_emulated(*c.problem, c.plan, g::parse_run_options(p), 11);
  INFO(rep.text);
  const HardwareProfile hw = resolve_hardware_profile("h200_8x_nvlink");
  REQUIRE(hw.kernel.has_value());
  const std::vector<RankCompute> want = predicted_compute(*c.problem, c.plan, hw);
  double fmax = 0;
  for (Rank r = 0; r < 3; ++r) {
    const auto i = static_cast<std::size_t>(r);
    const std::string id = fmt::format("rank{}", r);
    CHECK(rep.figures.get(id + ".model_fwd_ms").value_or(-1) == doctest::Approx(1e3 * want[i].fwd).epsilon(1e-12));
    CHECK(rep.figures.get(id + ".model_bwd_ms").value_or(-1) == doctest::Approx(1e3 * want[i].bwd).epsilon(1e-12));
    CHECK(want[i].bwd > want[i].fwd);
    fmax = std::max(fmax, 1e3 * want[i].fwd);
  }
  CHECK(rep.figures.get("model_fwd_ms").value_or(-1) == doctest::Approx(fmax).epsilon(1e-12));
  CHECK(rep.text.find("kernel model of hardware profile h200_8x_nvlink") != std::string::npos);
  CHECK(rep.text.find("fwd/model") != std::string::npos);  // the compute_timing table's columns

  Params bad;
  bad.set("backend", std::string("emulate"));
  bad.set("hardware", std::string("h999"));
  CHECK_THROWS_WITH_AS(g::run_emulated(*c.problem, c.plan, g::parse_run_options(bad), 11), doctest::Contains("h999"),
                       Error);
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

TEST_CASE("events come from a pool: repeated iterations create no more events than the first") {
  std::mt19937_64 rng(31);
  auto c = test::make_plan_case(test::random_document_mask(300, rng), 3, Heads{4, 2, 16, 2}, GridOptions{true, 1}, 2, 5);
  const g::HeadLayout h = g::HeadLayout::of(*c.problem);
  const std::vector<g::RankInputs> in = inputs_of(c, 7);
  const int P = c.plan.sharding.cp_size;
  g::HostWorld world(P);
  std::vector<int> after_one(static_cast<std::size_t>(P)), after_five(static_cast<std::size_t>(P));
  std::vector<g::RankOutputs> first(static_cast<std::size_t>(P)), last(static_cast<std::size_t>(P));
  g::run_rank_threads(world, P, [&](Rank r) {
    const auto i = static_cast<std::size_t>(r);
    // lazy_comm: the comm stream runs late, so a recycled event that a
    // pending wait still needed would show up as wrong numbers.
    g::HostBackend be(world, r, g::Schedule::lazy_comm);
    g::RankPipeline pipe(be, c.plan.ranks[i], h, c.plan.sharding.rank_tokens(r).size());
    pipe.set_inputs(in[i]);
    for (int it = 0; it < 5; ++it) {
      pipe.forward();
      pipe.backward();
      pipe.synchronize();
      if (it == 0) {
        after_one[i] = be.events_created();
        first[i] = pipe.outputs();
      }
    }
    after_five[i] = be.events_created();
    last[i] = pipe.outputs();
  });
  for (std::size_t i = 0; i < first.size(); ++i) {
    CHECK(after_one[i] > 0);
    CHECK(after_five[i] == after_one[i]);
    CHECK(last[i].o == first[i].o);
    CHECK(last[i].dk == first[i].dk);
  }
  // A wait on an event given back to the pool is an error, not a silent wrong order.
  g::HostWorld one(1);
  g::HostBackend be(one, 0);
  const g::Event e = be.record(g::StreamId::comm);
  be.recycle_events();
  CHECK_THROWS_WITH_AS(be.wait(g::StreamId::compute, e), doctest::Contains("not recorded"), Error);
}

TEST_CASE("the rank-by-rank check equals the whole-tensor comparison and finds a bad rank") {
  std::mt19937_64 rng(37);
  auto c = test::make_plan_case(test::random_document_mask(360, rng), 4, Heads{4, 2, 16, 2}, GridOptions{true, 1}, 2, 3);
  const g::HeadLayout h = g::HeadLayout::of(*c.problem);
  g::EmulatedRun run = g::emulate(c.plan, h, inputs_of(c, 9));
  // Perturb rank 2 a little: both comparisons must see the same errors.
  run.outputs[2].o[5] += 0.25f;
  run.outputs[2].lse[1] += 0.5f;
  run.outputs[1].dv[3] -= 0.125f;
  const sim::GlobalInputs gin = g::global_inputs(*c.problem, 9);
  sim::GlobalOutputs got = sim::GlobalOutputs::like(gin, 0.f, g::neg_inf());
  for (Rank r = 0; r < 4; ++r) g::place_outputs(c.plan.sharding, r, h, run.outputs[static_cast<std::size_t>(r)], got);
  const sim::VirtualRun ref = sim::run_virtual_ranks(*c.problem, c.plan, gin, 2);
  const sim::NumericErrors whole = sim::compare_outputs(got, ref.outputs);

  g::RankwiseCheck check(*c.problem, c.plan, 9, 2);
  for (Rank r : {3, 0, 2, 1}) check.add(r, run.outputs[static_cast<std::size_t>(r)]);  // any order
  const g::CheckResult res = check.finish(g::kDefaultTolerance);
  CHECK(res.errors.o == whole.o);
  CHECK(res.errors.lse == whole.lse);
  CHECK(res.errors.dq == whole.dq);
  CHECK(res.errors.dk == whole.dk);
  CHECK(res.errors.dv == whole.dv);
  CHECK(res.errors.o > 1e-2);
  CHECK(res.errors.dv > 1e-3);

  // A NaN anywhere is an infinite error; a missing or repeated rank is an error.
  run.outputs[3].dq[0] = std::numeric_limits<float>::quiet_NaN();
  g::RankwiseCheck nan_check(*c.problem, c.plan, 9, 2);
  for (Rank r = 0; r < 4; ++r) nan_check.add(r, run.outputs[static_cast<std::size_t>(r)]);
  CHECK(std::isinf(nan_check.finish(g::kDefaultTolerance).errors.dq));
  CHECK_FALSE(nan_check.finish(g::kDefaultTolerance).passed);
  g::RankwiseCheck partial(*c.problem, c.plan, 9, 2);
  partial.add(0, run.outputs[0]);
  CHECK_THROWS_WITH_AS(partial.add(0, run.outputs[0]), doctest::Contains("rank 0 compared twice"), Error);
  CHECK_THROWS_WITH_AS(partial.finish(g::kDefaultTolerance), doctest::Contains("rank 1 were never compared"), Error);
  g::RankOutputs wrong = run.outputs[1];
  wrong.lse.pop_back();
  CHECK_THROWS_WITH_AS(partial.add(1, wrong), doctest::Contains("do not match its"), Error);
}

TEST_CASE("a rank that fails stops the ranks waiting on it, and its error is the one reported") {
  // Rank 2 throws before sending; ranks 0, 1 and 3 wait for its data and are
  // woken by the abort (their errors are not the cause).
  g::HostWorld world(4);
  std::vector<int> finished(4, 0);
  CHECK_THROWS_WITH_AS(g::run_rank_threads(world, 4,
                                           [&](Rank r) {
                                             if (r == 2) throw Error("rank 2: bad shard");
                                             float x = 0;
                                             world.recv(r, 2, &x, sizeof x);
                                             finished[static_cast<std::size_t>(r)] = 1;
                                           }),
                       "rank 2: bad shard", Error);
  CHECK(finished == std::vector<int>{0, 0, 0, 0});
  // Ranks that all finish: nothing thrown, every body ran.
  g::HostWorld ok(3);
  std::vector<int> ran(3, 0);
  g::run_rank_threads(ok, 3, [&](Rank r) {
    const float v = static_cast<float>(r);
    ok.send(r, (r + 1) % 3, &v, sizeof v);
    float got = -1;
    ok.recv(r, (r + 2) % 3, &got, sizeof got);
    ran[static_cast<std::size_t>(r)] = static_cast<int>(got) + 1;
  });
  CHECK(ran == std::vector<int>{3, 1, 2});
}
