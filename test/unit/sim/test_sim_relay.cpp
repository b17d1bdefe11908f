// Relays in the sim runtime: numeric mode executes the forwarding phases
// (results equal the dense reference), and the timing model charges the extra
// hop as documented in timing.hpp (hand-computed cases).
#include <doctest/doctest.h>

#include <random>

#include "cpsched/hardware/profile.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/timing/model.hpp"
#include "numeric_check.hpp"
#include "plan_fixtures.hpp"
#include "random_specs.hpp"
#include "reference.hpp"
#include "sim_outcome.hpp"
#include "virtual_ranks.hpp"

using namespace cpsched;
using namespace cpsched::sim;

using test::Outcome;
using test::run_numeric;

TEST_CASE("relays: every mask generator x P in {2, 3, 4, 8, 16} x stages {1, 2} equals the reference") {
  std::mt19937_64 rng(31);
  int runs = 0, relayed = 0;
  for (const std::string& kind_name : mask_kind_names()) {
    MaskKind kind{};
    REQUIRE(parse_mask_kind(kind_name, kind));
    for (int P : {2, 3, 4, 8, 16}) {
      // Small nodes so that every P but 2 spans several of them.
      const int node = P <= 4 ? 2 : 4;
      auto grid = test::random_grid(kind, P, Heads{4, 2, 8, 2}, rng);
      // Random placement (many receivers per block) and owner (KV fan-out).
      for (const Assignment& a : {test::random_assignment(grid, rng), test::owner_assignment(grid)})
        for (int stages : {1, 2}) {
          CAPTURE(kind_name);
          CAPTURE(P);
          CAPTURE(stages);
          const Plan plan = build_plan(a, PlanOptions{stages, node});
          const Outcome o = run_numeric(grid->problem(), plan);
          INFO(o.str());
          CHECK(o.passed());
          ++runs;
          relayed += plan.has_forwarding() ? 1 : 0;
        }
    }
  }
  MESSAGE(runs, " plans checked numerically, ", relayed, " with relays");
  CHECK(relayed > runs / 3);  // P = 2 is one node; small masks leave little to share
}

TEST_CASE("relays: a forwarding that sends other rows fails the numeric check") {
  std::mt19937_64 rng(4);
  auto grid = test::random_grid(MaskKind::full, 8, Heads{4, 2, 8, 2}, rng);
  const Assignment a = test::random_assignment(grid, rng);
  Plan plan = build_plan(a, PlanOptions{1, 4});
  REQUIRE(run_numeric(grid->problem(), plan).passed());
  bool broke = false;
  for (RankPlan& rp : plan.ranks) {
    GroupCollectiveArg& f = rp.fwd.comm.stages[0].qo_fwd;
    const Token first = first_phase_tokens(rp.fwd.comm.stages[0].qo);
    for (Range& x : f.input_ranges)
      if (!broke && x.end < first) {
        ++x.begin, ++x.end;
        broke = true;
      }
  }
  REQUIRE(broke);
  CHECK_FALSE(run_numeric(grid->problem(), plan).passed());
}

namespace {

// hbm_gb_s = 0 unless a test sets it: no pack / unpack / merge charges.
HardwareProfile two_node_profile() {
  HardwareProfile hw;
  hw.name = "test";
  hw.fwd_tflops = 100;
  hw.bwd_tflops = 50;
  hw.gpus_per_node = 2;      // nodes {0, 1} {2, 3}
  hw.intra_node = {200, 5};  // 200 GB/s, 5 us
  hw.inter_node = {25, 20};
  return hw;
}

// P = 4, full mask over 64 tokens (16 rows per rank), heads 8:2, D 64, bf16,
// unflattened. Rank 0 casts its n KV rows to rank 2 (the relay), which
// forwards them to rank 3; both compute on them in stage 1.
struct RelayCase {
  Problem p = Problem::make(RangeMask(64, {{{0, 64}, {0, 64}, MaskType::full}}), 4, Heads{8, 2, 64, 2}, {false, 1});
  Plan plan;
  Token n = 16;
  RelayCase() {
    plan.num_stages = 1;
    plan.sharding = p.sharding;
    plan.ranks.resize(4);
    for (RankPlan& r : plan.ranks)
      for (PassPlan* pp : {&r.fwd, &r.bwd}) {
        pp->calc.remote_attn_args.resize(1);
        pp->comm.stages.resize(1);
      }
    for (Pass pass : {Pass::fwd, Pass::bwd}) {
      auto at = [&](int r) -> PassPlan& {
        return pass == Pass::fwd ? plan.ranks[static_cast<std::size_t>(r)].fwd : plan.ranks[static_cast<std::size_t>(r)].bwd;
      };
      GroupCollectiveArg& src = at(0).comm.stages[0].kv;
      src.input_split_sizes = {n};
      src.input_ranges = {{0, n}};
      src.input_groups = {-1};
      src.dst_indices = {{2}};
      StageComm& relay = at(2).comm.stages[0];
      relay.kv.output_split_sizes = {n};
      relay.kv.src_index = {0};
      relay.kv.output_groups = {-1};
      relay.kv_fwd.input_split_sizes = {n};
      relay.kv_fwd.input_ranges = {{0, n}};
      relay.kv_fwd.input_groups = {-1};
      relay.kv_fwd.dst_indices = {{3}};
      relay.num_remote_kv_tokens = n;
      StageComm& leaf = at(3).comm.stages[0];
      leaf.kv_fwd.output_split_sizes = {n};
      leaf.kv_fwd.src_index = {2};
      leaf.kv_fwd.output_groups = {-1};
      leaf.num_remote_kv_tokens = n;
      for (int r = 0; r < 4; ++r) at(r).comm.stages[0].kv_reduce_after = 1;
      for (int r : {2, 3})
        at(r).calc.remote_attn_args[0] = {{{0, n}, {0, n}, MaskType::full, BufferId::local, BufferId::remote, -1}};
    }
  }
};

double seconds_of(double bytes, double gb_s) { return bytes / (gb_s * 1e9); }

}  // namespace

TEST_CASE("relay timing, forward: the forwarding phase follows the relay's first phase, compute waits for it") {
  const RelayCase c;
  const HardwareProfile hw = two_node_profile();
  const double b = static_cast<double>(c.n * fwd_bytes_per_token(c.p).kv_out);
  const double first = 20e-6 + seconds_of(b, 25);           // 0 -> 2 over the NIC
  const double second = first + 5e-6 + seconds_of(b, 200);  // 2 -> 3 over NVLink
  const double flops = 4.0 * 16 * 16 * 8 * 64;
  const double compute = flops / 100e12;
  const PassTimeline t = simulate_pass(c.p, c.plan, hw, Pass::fwd);
  CHECK(t.ranks[0].end == doctest::Approx(first).epsilon(1e-12));
  CHECK(t.ranks[2].end == doctest::Approx(second + compute).epsilon(1e-12));
  CHECK(t.ranks[3].end == doctest::Approx(second + compute).epsilon(1e-12));
  // Rank 2's ops: the first phase's cast, then the forwarding phase's.
  REQUIRE(t.ranks[2].comm.size() == 2);
  CHECK_FALSE(t.ranks[2].comm[0].forwarding);
  CHECK(t.ranks[2].comm[1].forwarding);
  CHECK(t.ranks[2].comm[1].start == doctest::Approx(first).epsilon(1e-12));
  CHECK(t.ranks[2].comm[0].messages == 2);  // K and V from rank 0
  CHECK(t.ranks[2].comm[1].messages == 2);  // K and V to rank 3
  CHECK(t.ranks[2].comm[1].bytes == doctest::Approx(b));
  // Without the relay rank 0 would send the rows twice over its NIC port.
  const double direct = 20e-6 + seconds_of(2 * b, 25);
  CHECK(direct > first);
  const StepEstimate e = estimate_step(c.p, c.plan, hw);
  CHECK(e.fwd == doctest::Approx(t.makespan()).epsilon(1e-12));
}

TEST_CASE("relay timing, backward: partials go back to the relay first, merged there, then to the source") {
  const RelayCase c;
  HardwareProfile hw = two_node_profile();
  const TransferBytes tb = bwd_bytes_per_token(c.p);
  const double out = static_cast<double>(c.n * tb.kv_out), back = static_cast<double>(c.n * tb.kv_back);
  const double compute = 2.5 * 4.0 * 16 * 16 * 8 * 64 / 50e12;
  const double cast1 = 20e-6 + seconds_of(out, 25);
  const double cast2 = cast1 + 5e-6 + seconds_of(out, 200);
  const double red1 = cast2 + compute + 5e-6 + seconds_of(back, 200);  // 3 -> 2: forwarded partial
  const double red0 = red1 + 20e-6 + seconds_of(back, 25);             // 2 -> 0: the merged rows
  PassTimeline t = simulate_pass(c.p, c.plan, hw, Pass::bwd);
  CHECK(t.ranks[3].end == doctest::Approx(red1).epsilon(1e-12));
  CHECK(t.ranks[2].end == doctest::Approx(red0).epsilon(1e-12));
  CHECK(t.ranks[0].end == doctest::Approx(red0).epsilon(1e-12));

  // With HBM charges the relay merges what rank 3 returns (3 x bytes / HBM)
  // on its compute stream before its own reduce.
  hw.hbm_gb_s = 1000;
  t = simulate_pass(c.p, c.plan, hw, Pass::bwd);
  const TimedOp* fwd_reduce = nullptr;
  const TimedOp* reduce = nullptr;
  const TimedOp* merge = nullptr;
  for (const TimedOp& op : t.ranks[2].comm)
    if (op.kind == OpKind::reduce) (op.forwarding ? fwd_reduce : reduce) = &op;
  for (const TimedOp& op : t.ranks[2].compute)
    if (op.kind == OpKind::merge && op.forwarding) merge = &op;
  REQUIRE(fwd_reduce != nullptr);
  REQUIRE(reduce != nullptr);
  REQUIRE(merge != nullptr);
  const double port = 5e-6 + seconds_of(back, 200);
  CHECK(fwd_reduce->end - fwd_reduce->start == doctest::Approx(port).epsilon(1e-9));
  CHECK(merge->start == doctest::Approx(fwd_reduce->end).epsilon(1e-12));
  CHECK(merge->end - merge->start == doctest::Approx(kMergeFactor * seconds_of(back, 1000)).epsilon(1e-9));
  CHECK(merge->bytes == doctest::Approx(back));
  // Rank 2 packs its merged rows (2 x bytes / HBM) once the merge is done.
  CHECK(reduce->start == doctest::Approx(merge->end + kPackFactor * seconds_of(back, 1000)).epsilon(1e-9));
}

TEST_CASE("relay timing: estimate_step equals the timeline's makespans, visits each part a bounded number of times") {
  std::mt19937_64 rng(12);
  for (int stages : {1, 3}) {
    const int P = 16;
    auto grid = test::random_grid(MaskKind::causal_document, P, Heads{4, 2, 8, 2}, rng);
    const Plan plan = build_plan(test::random_assignment(grid, rng), PlanOptions{stages, 4});
    REQUIRE(plan.has_forwarding());
    HardwareProfile hw = two_node_profile();
    hw.gpus_per_node = 4;
    hw.hbm_gb_s = 2000;
    for (bool overlap : {true, false}) {
      hw.overlap = overlap;
      TimingWorkspace ws;
      const StepEstimate e = estimate_step(grid->problem(), plan, hw, ws);
      const Timeline t = simulate_timeline(grid->problem(), plan, hw);
      CHECK(e.fwd == t.fwd.makespan());
      CHECK(e.bwd == t.bwd.makespan());
      // Parts: 2 passes x (cast, reduce) x 2 phases x 2 kinds x N stages x P
      // ranks, at most 3 visits each: linear in the plan, twice a plan without relays.
      CHECK(ws.parts_visited() <= 3 * 2 * 2 * 2 * 2 * std::int64_t{stages} * P);
      // Relays make the step no faster than the compute bound.
      CHECK(e.step() >= e.compute_bound);
    }
  }
}
