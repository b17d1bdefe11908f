// Relays (two-level collectives): plans built with relay_node_size move the
// same rows to the same ranks, a block several ranks of another node need
// crosses the NIC once, and the validator proves relayed data like direct data.
#include <doctest/doctest.h>

#include <random>

#include "brute_force.hpp"
#include "cpsched/config/config.hpp"
#include "cpsched/session/session.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/io/plan_json.hpp"
#include "cpsched/plan/validator.hpp"
#include "cpsched/mask/generators.hpp"
#include "plan_checks.hpp"
#include "plan_fixtures.hpp"
#include "random_specs.hpp"

using namespace cpsched;

namespace {

// Rows (x receivers) of one pass that cross node boundaries, per phase.
struct Crossing {
  Token inter = 0, intra = 0, forwarded = 0;
};
Crossing crossing(const Plan& plan, int node) {
  Crossing c;
  for (std::size_t r = 0; r < plan.ranks.size(); ++r)
    for (const StageComm& sc : plan.ranks[r].fwd.comm.stages)
      for (RowKind k : {RowKind::qo, RowKind::kv}) {
        const GroupCollectiveArg& g = collective(sc, k);
        for (std::size_t i = 0; i < g.dst_indices.size(); ++i)
          for (Rank d : g.dst_indices[i])
            (d / node == static_cast<Rank>(r) / node ? c.intra : c.inter) += g.input_split_sizes[i];
        const GroupCollectiveArg& f = forwarding(sc, k);
        for (std::size_t i = 0; i < f.dst_indices.size(); ++i)
          for (Rank d : f.dst_indices[i]) {
            CHECK(d / node == static_cast<Rank>(r) / node);  // relays forward inside their node
            c.forwarded += f.input_split_sizes[i];
          }
      }
  return c;
}

}  // namespace

TEST_CASE("relays: valid plans, same coverage, fewer NIC rows, off is the plain plan") {
  std::mt19937_64 rng(2024);
  int with_forwarding = 0, plans = 0;
  for (const std::string& kind_name : mask_kind_names()) {
    MaskKind kind{};
    REQUIRE(parse_mask_kind(kind_name, kind));
    for (auto [P, node] : {std::pair{4, 2}, {6, 2}, {8, 4}, {16, 4}, {16, 8}}) {
      auto grid = test::random_grid(kind, P, Heads{4, 2, 8, 2}, rng);
      const Assignment a = test::random_assignment(grid, rng);
      for (int stages : {1, 2, 3}) {
        CAPTURE(kind_name);
        CAPTURE(P);
        CAPTURE(node);
        CAPTURE(stages);
        const Plan plain = build_plan(a, stages);
        CHECK(test::same_plan(build_plan(a, PlanOptions{stages, 0}), plain));
        CHECK(test::same_plan(build_plan(a, PlanOptions{stages, 1}), plain));
        CHECK_FALSE(plain.has_forwarding());
        const Plan relay = build_plan(a, PlanOptions{stages, node});
        test::check_valid_plan(a, relay, grid->problem().seqlen() <= 200);
        // Same rows to the same ranks: receive sizes and loads are the plain plan's.
        test::check_same_receives(relay, plain);
        const Crossing cp = crossing(plain, node), cr = crossing(relay, node);
        CHECK(cp.forwarded == 0);
        CHECK(cr.inter + cr.forwarded == cp.inter);  // every relayed copy moved from the NIC to NVLink
        CHECK(cr.intra == cp.intra);
        with_forwarding += relay.has_forwarding() ? 1 : 0;
        ++plans;
      }
    }
  }
  MESSAGE(plans, " plans, ", with_forwarding, " with relays");
  CHECK(with_forwarding > plans / 2);
}

TEST_CASE("relays: hand-checked plan, one block to three ranks of another node") {
  // S = 8, P = 4 (2 tokens each), nodes {0, 1} {2, 3}, full mask, one head
  // group. Every kv block of rank 0 is needed by ranks 1, 2, 3; with relays
  // ranks 2 and 3 get it once over the NIC (at rank 2, the lower of two
  // equally loaded ranks) and rank 2 forwards it to rank 3.
  auto g = test::make_grid(RangeMask(8, {{{0, 8}, {0, 8}, MaskType::full}}), 4, Heads{2, 1, 8, 2});
  const Assignment a = test::owner_assignment(g);  // every rank needs every other rank's KV
  const Plan plan = build_plan(a, PlanOptions{1, 2});
  REQUIRE(validate_plan(a, plan).empty());
  const StageComm& s0 = plan.ranks[0].fwd.comm.stages.at(0);
  REQUIRE(s0.kv.dst_indices.size() == 1);
  CHECK(s0.kv.dst_indices[0] == std::vector<Rank>{1, 2});
  CHECK(s0.kv.input_ranges[0] == Range{0, 2});
  const StageComm& s2 = plan.ranks[2].fwd.comm.stages.at(0);
  // Rank 2 relays rank 0's rows; rank 1's rows go to rank 3 as the relay
  // (fewer NIC bytes by then) and reach rank 2 forwarded; rank 3's rows come
  // from its node peer directly. Rank 2 forwards rank 0's rows to rank 3.
  CHECK(s2.kv.src_index == std::vector<Rank>{0, 3});
  REQUIRE(s2.kv_fwd.input_split_sizes == std::vector<Token>{2});
  CHECK(s2.kv_fwd.input_ranges[0] == Range{0, 2});
  CHECK(s2.kv_fwd.dst_indices[0] == std::vector<Rank>{3});
  CHECK(s2.kv_fwd.src_index == std::vector<Rank>{3});
  // Rank 2's own rows go to rank 0 (relay of node 0) and to rank 3 directly.
  CHECK(s2.kv.dst_indices == std::vector<std::vector<Rank>>{{0, 3}});
  CHECK(plan.ranks[0].fwd.comm.stages[0].kv_fwd.dst_indices == std::vector<std::vector<Rank>>{{1}});
  CHECK(s2.num_remote_kv_tokens == 6);
  const StageComm& s3 = plan.ranks[3].fwd.comm.stages.at(0);
  CHECK(s3.kv.src_index == std::vector<Rank>{1, 2});
  CHECK(s3.kv_fwd.src_index == std::vector<Rank>{2});
  CHECK(s3.kv_fwd.output_split_sizes == std::vector<Token>{2});
  CHECK(s3.kv_fwd.dst_indices == std::vector<std::vector<Rank>>{{2}});
  CHECK(s3.num_remote_kv_tokens == 6);
}

TEST_CASE("relays: the validator rejects a forwarding that moves other rows") {
  std::mt19937_64 rng(9);
  auto grid = test::random_grid(MaskKind::full, 8, Heads{4, 2, 8, 2}, rng);
  const Assignment a = test::random_assignment(grid, rng);
  Plan plan = build_plan(a, PlanOptions{1, 4});
  REQUIRE(validate_plan(a, plan).empty());
  bool broke = false;
  for (RankPlan& rp : plan.ranks) {
    GroupCollectiveArg& f = rp.fwd.comm.stages[0].kv_fwd;
    const Token first = first_phase_tokens(rp.fwd.comm.stages[0].kv);
    for (Range& x : f.input_ranges)
      if (!broke && x.end < first) {  // shift by one row: other data reaches the receivers
        ++x.begin, ++x.end;
        broke = true;
      }
  }
  REQUIRE(broke);
  CHECK_FALSE(validate_plan(a, plan).empty());
}

TEST_CASE("relays: a negative node size is an error") {
  auto g = test::make_grid(RangeMask(8, {{{0, 8}, {0, 8}, MaskType::full}}), 4, Heads{2, 1, 8, 2});
  CHECK_THROWS_WITH(build_plan(test::owner_assignment(g), PlanOptions{1, -1}), doctest::Contains("relay_node_size"));
}

TEST_CASE("plan.relay: off | on | auto, the node size from the hardware profile, a precise error otherwise") {
  using Relay = PlanShape::Relay;
  const std::string yaml = "problem: {cp_size: 16, seqlen_per_rank: 64}\n";
  CHECK(parse_config(yaml, "t.yaml").plan.relay == Relay::off);
  CHECK(parse_config(yaml + "plan: {relay: off}\n", "t.yaml").plan.relay == Relay::off);
  const Config on = parse_config(yaml + "plan: {relay: on}\n", "t.yaml");
  CHECK(on.plan.relay == Relay::on);
  CHECK(Session::options_from(on).plan.relay_node_size() == 8);  // h100_8x_nvlink, the default profile
  CHECK(Session::options_from(parse_config(yaml + "hardware: cluster_8gpu_ib\n", "t.yaml", {"plan.relay=on"}))
            .plan.relay_node_size() == resolve_hardware_profile("cluster_8gpu_ib").gpus_per_node);
  CHECK(Session::options_from(parse_config(yaml, "t.yaml", {"plan.relay=off"})).plan.relay_node_size() == 0);
  CHECK(parse_config(yaml + "plan: {relay: auto}\n", "t.yaml").plan.relay == Relay::automatic);
  const SessionOptions a = Session::options_from(parse_config(yaml, "t.yaml", {"plan.relay=auto"}));
  CHECK(a.plan.auto_relay());
  CHECK(a.plan.node_size == 8);
  try {
    parse_config(yaml + "plan: {relay: sometimes}\n", "t.yaml");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("t.yaml:2:15: plan.relay: expected off, on or auto, got 'sometimes'") !=
          std::string::npos);
  }
}

TEST_CASE("Session: relays on builds relayed plans, and keys the cache apart") {
  SessionOptions o;
  o.cp_size = 8;
  o.heads = Heads{4, 2, 8, 2};
  o.solver = "owner";
  o.cache_size = 4;
  Session plain(o);
  o.plan = PlanShape::fixed(1, 4);
  Session relayed(o);
  const RangeMask mask(256, {{{0, 256}, {0, 256}, MaskType::causal}});
  CHECK_FALSE(plain.solve(mask).plan->has_forwarding());
  CHECK(relayed.solve(mask).plan->has_forwarding());
  CHECK(relayed.validate().empty());
  CHECK(make_plan_key(relayed.problem(), "owner", {}, "area", {}, PlanShape::fixed(1, 4)) !=
        make_plan_key(relayed.problem(), "owner", {}, "area", {}, PlanShape::fixed(1, 0)));
  o.plan.node_size = 1;
  CHECK_THROWS_WITH(Session{o}, doctest::Contains("node size must be at least 2"));
}

TEST_CASE("relay auto: balanced_bytes chooses under the time model, and the Session builds what it chose") {
  SessionOptions o;
  o.cp_size = 16;
  o.heads = Heads{8, 2, 16, 2};
  o.solver = "balanced_bytes";
  o.solver_params.set("members", std::string("static"));
  o.cost_model = "time";
  o.cost_params.set("hardware", std::string("cluster_8gpu_ib"));
  o.plan.relay = PlanShape::Relay::automatic;
  o.validate = true;
  Session s(o);
  const RangeMask mask(1024, {{{0, 1024}, {0, 1024}, MaskType::causal}});
  const SolveResult& r = s.solve(mask);
  // A choice was made (none or the profile's 8 per node), and the plan is the one chosen.
  CHECK((r.shape.relay_node_size() == 0 || r.shape.relay_node_size() == 8));
  CHECK(r.plan->has_forwarding() == (r.shape.relay_node_size() == 8));
  CHECK(r.figures.get("relay_node_size") == r.shape.relay_node_size());
  CHECK(s.validate().empty());
  // With relays off the plan has none.
  o.plan.relay = PlanShape::Relay::off;
  Session off(o);
  CHECK(off.solve(mask).shape.relay == PlanShape::Relay::off);
  CHECK_FALSE(off.result().plan->has_forwarding());
}

TEST_CASE("plan JSON: forwarding phases only when present") {
  auto g = test::make_grid(RangeMask(8, {{{0, 8}, {0, 8}, MaskType::full}}), 4, Heads{2, 1, 8, 2});
  const Assignment a = test::owner_assignment(g);
  const Metrics m = compute_metrics(a);
  const Plan plain = build_plan(a, 1), relay = build_plan(a, PlanOptions{1, 2});
  PlanExport e;
  e.assignment = &a;
  e.metrics = &m;
  e.plan = &plain;
  const std::string pj = plan_json(e);
  CHECK(pj.find("_fwd") == std::string::npos);
  e.plan = &relay;
  const std::string rj = plan_json(e);
  // Rank 0 forwards rank 2's rows to rank 1: one split of 2 rows in its first-phase rows.
  CHECK(rj.find("\"kv_fwd\":{\"dst_indices\":[[1]],\"input_groups\":[0],\"input_ranges\":[[") != std::string::npos);
  CHECK(rj.find("\"qo_fwd\"") == std::string::npos);  // owner moves no QO
}
