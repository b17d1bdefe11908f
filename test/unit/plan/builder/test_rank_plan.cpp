// One rank's plan (PlanOptions::rank, SessionOptions::rank): what each rank
// of a run builds for itself must be exactly its part of the all-ranks plan,
// for every solver, every kind of mask, uneven P, one stage or the solver's
// choice, with and without relays, in both layouts.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>
#include <functional>
#include <random>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/plan/validator.hpp"
#include "cpsched/session/session.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/timing/model.hpp"
#include "host_solve.hpp"
#include "plan_checks.hpp"
#include "plan_fixtures.hpp"
#include "random_index_masks.hpp"
#include "random_specs.hpp"

using namespace cpsched;

namespace {

const MaskKind kKinds[] = {MaskKind::full,           MaskKind::causal,         MaskKind::full_document,
                           MaskKind::causal_document, MaskKind::sliding_window, MaskKind::prefix_lm,
                           MaskKind::share_question,  MaskKind::block_causal_document};

// Every rank's own build against the full plan; the other ranks' entries of
// a one-rank plan stay empty.
void check_every_rank(const Assignment& a, const PlanOptions& full_options) {
  const Plan full = build_plan(a, full_options);
  for (Rank r = 0; r < a.grid->cp_size(); ++r) {
    PlanOptions o = full_options;
    o.rank = r;
    const Plan mine = build_plan(a, o);
    CAPTURE(r);
    CHECK(mine.only_rank == r);
    CHECK(mine.num_stages == full.num_stages);
    REQUIRE(mine.ranks.size() == full.ranks.size());
    CHECK(mine.ranks[static_cast<std::size_t>(r)] == full.ranks[static_cast<std::size_t>(r)]);
    for (Rank other = 0; other < a.grid->cp_size(); ++other)
      if (other != r) CHECK(mine.ranks[static_cast<std::size_t>(other)] == RankPlan{});
  }
}

}  // namespace

TEST_CASE("a rank's plan is its part of the all-ranks plan: every solver, mask kind, P, stages, layout") {
  std::mt19937_64 rng(31);
  const AreaCostModel area;
  const TimeCostModel time(resolve_hardware_profile("cluster_8gpu_ib"));
  int checked = 0;
  for (const std::string& name : test::solver_names()) {
    if (name == "ilp") continue;  // its placements are other solvers' (and wall-clock bound): covered by them
    auto solver = test::build_registry().make_solver(
        name, test::build_registry().resolve_params(test::build_registry().find(PluginKind::solver, name),
                                                    test::quick_params(name)));
    for (Layout layout : {Layout::fixed, Layout::planned}) {
      if (name == "static" && layout == Layout::fixed) continue;  // it refuses: tested in test_layout
      for (MaskKind kind : kKinds)
        for (int P : {3, 8, 16}) {
          auto grid = test::random_grid(kind, P, Heads{4, 2, 8, 2}, rng, layout);
          const CostModel& cost = name == "balanced_bytes" ? static_cast<const CostModel&>(time) : area;
          for (int stages : {1, PlanShape::kAutoStages}) {
            const PlanShape asked = test::shape(stages, P > 8 ? -1 : 0);
            const Solution sol = test::host_solve(*solver, grid, cost, asked);
            PlanShape s = asked;
            if (s.auto_relay()) s.node_size = 8;
            s = s.resolve(sol.shape);
            CAPTURE(name);
            CAPTURE(to_string(kind));
            CAPTURE(P);
            CAPTURE(stages);
            PlanOptions po{s.stages, s.relay_node_size()};
            po.hardware = cost.hardware();  // as the solve path builds it
            po.timer = &timing_model_timer();
            if (po.hardware != nullptr) po.stage_cut = s.cut;
            check_every_rank(sol.assignment, po);
            ++checked;
          }
        }
    }
  }
  CHECK(checked > 200);
}

TEST_CASE("a rank's plan with relays, and of token top-k masks, is its part of the full plan") {
  std::mt19937_64 rng(5);
  for (int P : {3, 8, 16}) {
    auto grid = test::random_grid(MaskKind::causal_document, P, Heads{4, 2, 8, 2}, rng);
    const Assignment a = test::random_assignment(grid, rng);
    for (int stages : {1, 3}) check_every_rank(a, PlanOptions{stages, 2});
  }
  for (int P : {3, 8}) {
    auto grid = std::make_shared<const TaskGrid>(
        test::planned(Problem::make(test::random_topk(97, 2, 5, rng), P, Heads{4, 2, 8, 2})));
    const Assignment a = test::random_assignment(grid, rng);
    for (int stages : {1, 2}) check_every_rank(a, PlanOptions{stages, 0});
  }
}

TEST_CASE("SessionOptions::rank: the session serves its own rank's metadata, the same as every rank's plan") {
  SessionOptions o;
  o.cp_size = 8;
  o.heads = Heads{4, 2, 8, 2};
  o.solver = "balanced_bytes";
  o.cost_model = "time";
  o.plan.stages = PlanShape::kAutoStages;
  Session all(o);
  const RangeMask mask(1024, {{{0, 600}, {0, 600}, MaskType::causal}, {{600, 1024}, {600, 1024}, MaskType::causal}});
  all.solve(mask);
  for (Rank r = 0; r < 8; ++r) {
    o.rank = r;
    Session mine(o);
    mine.solve(mask);
    CAPTURE(r);
    CHECK(mine.calc_meta(r) == all.calc_meta(r));
    CHECK(mine.comm_meta(r, Pass::bwd) == all.comm_meta(r, Pass::bwd));
    CHECK(mine.assignment().rank == all.assignment().rank);
    CHECK(mine.metrics().fwd.total_send == all.metrics().fwd.total_send);
    CHECK_THROWS_WITH_AS(mine.calc_meta((r + 1) % 8), doctest::Contains("builds rank"), Error);
  }
  o.rank = 8;
  CHECK_THROWS_WITH_AS(Session{o}, doctest::Contains("rank must be -1"), Error);
}

// The shape a solve returns names the cut its plan took (the solver's, or the
// one the host priced), so a rank that rebuilds from it gets the same plan
// without pricing both cuts.
TEST_CASE("the solve path's shape names the stage cut its plan took") {
  const HardwareProfile hw = resolve_hardware_profile("h100_8x_nvlink");
  MaskSpec spec;
  spec.kind = MaskKind::causal_document;
  spec.histogram = DocHistogram::load_csv(
      (std::filesystem::path(CPSCHED_SOURCE_DIR) / "configs" / "data" / "doc_length_distribution.csv").string());
  spec.seed = 42;
  const RangeMask mask = make_mask(spec, Token{8192} * 16);
  for (const PlanUses uses : {PlanUses{1}, PlanUses::ahead()}) {
    CAPTURE(uses.str());
    SessionOptions o;
    o.cp_size = 16;
    o.heads = Heads{64, 8, 128, 2};
    o.solver = "balanced_bytes";
    o.cost_model = "time";
    o.cost_params.set("hardware", std::string("h100_8x_nvlink"));
    o.plan.stages = PlanShape::kAutoStages;
    o.plan.relay = PlanShape::Relay::automatic;
    o.layout = Layout::fixed;
    o.uses = uses;
    Session session(o);
    const SolveResult& r = session.solve(mask);
    REQUIRE(r.shape.stages >= 2);
    CHECK(r.shape.cut != PlanShape::Cut::automatic);
    PlanOptions po{r.shape.stages, r.shape.relay_node_size()};
    po.hardware = &hw;
    po.timer = &timing_model_timer();
    po.stage_cut = r.shape.cut;
    CHECK(test::same_plan(build_plan(*r.assignment, po), *r.plan));
  }
}

// A rank's plan is validated as that rank's part among its peers
// (validate_result), not as a whole plan with P - 1 empty entries.
TEST_CASE("a rank's plan validates as its rank's part: stages, relays, the profile's cut, and a tampered entry") {
  const RangeMask mask(1536, {{{0, 700}, {0, 700}, MaskType::causal},
                              {{700, 1536}, {700, 1536}, MaskType::causal},
                              {{1200, 1536}, {0, 300}, MaskType::full}});
  struct Case {
    int P, stages, relay;
    const char* cost;
  };
  int checked = 0;
  for (const Case c : {Case{3, 1, 0, "area"}, Case{8, PlanShape::kAutoStages, 0, "time"},
                       Case{8, 2, 4, "area"}, Case{5, 3, 0, "time"}}) {
    SessionOptions o;
    o.cp_size = c.P;
    o.heads = Heads{4, 2, 8, 2};
    o.solver = "balanced_bytes";
    o.cost_model = c.cost;
    o.plan.stages = c.stages;
    if (c.relay > 0) o.plan = PlanShape{c.stages, PlanShape::Relay::on, c.relay};
    o.validate = true;  // (the solve path validates each rank's plan among its peers)
    for (Rank r = 0; r < c.P; ++r) {
      CAPTURE(c.P);
      CAPTURE(c.stages);
      CAPTURE(c.relay);
      CAPTURE(r);
      o.rank = r;
      Session mine(o);
      const SolveResult& res = mine.solve(mask);
      REQUIRE(res.plan->only_rank == r);
      CHECK(mine.validate() == std::vector<std::string>{});
      // The whole-plan validator names it a rank's plan, in one problem.
      const auto whole = validate_plan(*res.assignment, *res.plan);
      REQUIRE(whole.size() == 1);
      CHECK(whole[0].starts_with(fmt::format("plan: it is rank {}'s plan", r)));
      ++checked;
    }
  }
  CHECK(checked == 3 + 8 + 8 + 5);

  // Tampered entries are found among the peers.
  SessionOptions o;
  o.cp_size = 4;
  o.heads = Heads{4, 2, 8, 2};
  o.plan.stages = 2;
  o.rank = 2;
  Session mine(o);
  const SolveResult& res = mine.solve(mask);
  PlanOptions po{res.shape.stages, 0};
  po.rank = 2;
  po.peers_comm = true;
  const Plan peers = build_plan(*res.assignment, po);
  CHECK(validate_rank_plan(*res.assignment, *res.plan, peers) == std::vector<std::string>{});
  auto problems_of = [&](const std::function<void(Plan&)>& tamper) {
    Plan p = *res.plan;
    tamper(p);
    return validate_rank_plan(*res.assignment, p, peers);
  };
  auto has = [](const std::vector<std::string>& v, const std::string& what) {
    for (const auto& s : v)
      if (s.find(what) != std::string::npos) return true;
    return false;
  };
  // An arg dropped: its task is computed in part, or by no arg.
  const auto dropped = problems_of([](Plan& p) {
    auto& args = p.ranks[2].fwd.calc.local_attn_args;
    REQUIRE(!args.empty());
    args.pop_back();
  });
  CHECK((has(dropped, "is computed by no arg") || has(dropped, "but the args compute")));
  // A received split of another size: the senders' splits disagree.
  CHECK(has(problems_of([](Plan& p) {
              for (StageComm& s : p.ranks[2].fwd.comm.stages)
                if (!s.kv.output_split_sizes.empty()) {
                  s.kv.output_split_sizes[0] += 1;
                  return;
                }
              FAIL("rank 2 receives no KV");
            }),
            "but the senders' input splits naming rank 2 give"));
  // Another rank's entry in a rank's plan.
  CHECK(has(problems_of([&](Plan& p) { p.ranks[1] = peers.ranks[1]; }), "holds an entry for rank 1"));
  // Another stage count than its peers.
  CHECK(has(problems_of([](Plan& p) { p.num_stages += 1; }), "they were built with other options"));
}
