// Numeric mode of the sim runtime: plans executed on virtual ranks equal the
// dense single-device reference (relative error <= 1e-4 for O, lse, dQ, dK,
// dV), and a plan that moves data other than it should fails the check.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <random>

#include "cpsched/plugin/cost_model.hpp"
#include "plan_fixtures.hpp"
#include "host_solve.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "random_specs.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/plugin/registry.hpp"
#include "numeric_check.hpp"
#include "reference.hpp"
#include "sim_outcome.hpp"
#include "sim_runner.hpp"
#include "virtual_ranks.hpp"

using namespace cpsched;
using namespace cpsched::sim;

namespace {

using test::kTol;
using test::Outcome;
using test::run_numeric;

// A hand-written plan (no plan builder involved): full mask over S = 15
// tokens, P = 2 (shards of 8 and 7), GQA 4:2 flattened into 2 head groups.
// Diagonal cells stay local; of the off-diagonal cells, group 0 runs on rank
// 0 and group 1 on rank 1, so each rank receives Q of one cell and K/V of the
// other: remote q, remote k, both groups' head offsets and both reduces.
struct HandPlan {
  Problem problem;
  Plan plan;
};

HandPlan hand_plan() {
  HandPlan h;
  h.problem = Problem::make(RangeMask(15, {{{0, 15}, {0, 15}, MaskType::full}}), 2, Heads{4, 2, 8, 2}, {true, 1});
  h.plan.num_stages = 1;
  h.plan.sharding = h.problem.sharding;
  h.plan.ranks.resize(2);
  const Token rows[2] = {8, 7};
  for (int r = 0; r < 2; ++r) {
    const int other = 1 - r, g = r;  // rank r computes group r of the off-diagonal cells
    PassPlan pp;
    for (int grp = 0; grp < 2; ++grp)
      pp.calc.local_attn_args.push_back({{0, rows[r]}, {0, rows[r]}, MaskType::full, BufferId::local, BufferId::local, grp});
    pp.calc.remote_attn_args = {{
        {{0, rows[other]}, {0, rows[r]}, MaskType::full, BufferId::remote, BufferId::local, g},  // remote Q
        {{0, rows[r]}, {0, rows[other]}, MaskType::full, BufferId::local, BufferId::remote, g},  // remote K, V
    }};
    StageComm sc;
    sc.num_remote_qo_tokens = sc.num_remote_kv_tokens = rows[other];
    sc.qo_reduce_after = sc.kv_reduce_after = 1;
    for (GroupCollectiveArg* a : {&sc.qo, &sc.kv}) {
      // Send my rows of the other rank's group; receive the other rank's rows of mine.
      a->input_split_sizes = {rows[r]};
      a->input_ranges = {{0, rows[r]}};
      a->input_groups = {other};
      a->dst_indices = {{other}};
      a->output_split_sizes = {rows[other]};
      a->src_index = {other};
      a->output_groups = {g};
    }
    pp.comm.stages = {sc};
    h.plan.ranks[static_cast<std::size_t>(r)] = {pp, pp};
  }
  return h;
}

// Applies f to both passes of rank r.
template <class F>
void both_passes(Plan& plan, int r, F&& f) {
  f(plan.ranks[static_cast<std::size_t>(r)].fwd);
  f(plan.ranks[static_cast<std::size_t>(r)].bwd);
}

}  // namespace

TEST_CASE("a hand-written two-rank plan equals the dense reference") {
  const HandPlan h = hand_plan();
  const Outcome o = run_numeric(h.problem, h.plan);
  INFO(o.str());
  CHECK(o.passed());
}

TEST_CASE("the result does not depend on the thread count") {
  const HandPlan h = hand_plan();
  const GlobalInputs in = GlobalInputs::generate(h.problem, 3);
  const VirtualRun a = run_virtual_ranks(h.problem, h.plan, in, 1);
  const VirtualRun b = run_virtual_ranks(h.problem, h.plan, in, 3);
  CHECK(a.outputs.o == b.outputs.o);
  CHECK(a.outputs.dk == b.outputs.dk);
}

TEST_CASE("hand-written plan: every broken transfer fails the check") {
  SUBCASE("a split sent but not expected") {
    HandPlan h = hand_plan();
    both_passes(h.plan, 1, [](PassPlan& p) { p.comm.stages[0].kv.dst_indices[0].clear(); });
    const Outcome o = run_numeric(h.problem, h.plan);
    INFO(o.str());
    CHECK_FALSE(o.passed());
    CHECK_FALSE(o.faults.empty());
  }
  SUBCASE("a transfer removed on both sides: the receiver's buffer is never filled") {
    HandPlan h = hand_plan();
    both_passes(h.plan, 1, [](PassPlan& p) {
      GroupCollectiveArg& kv = p.comm.stages[0].kv;
      kv.input_split_sizes.clear();
      kv.input_ranges.clear();
      kv.input_groups.clear();
      kv.dst_indices.clear();
    });
    both_passes(h.plan, 0, [](PassPlan& p) {
      GroupCollectiveArg& kv = p.comm.stages[0].kv;
      kv.output_split_sizes.clear();
      kv.src_index.clear();
      kv.output_groups.clear();
      p.comm.stages[0].num_remote_kv_tokens = 0;
    });
    const Outcome o = run_numeric(h.problem, h.plan);
    INFO(o.str());
    CHECK_FALSE(o.passed());
  }
  SUBCASE("the wrong head group travels") {
    HandPlan h = hand_plan();
    // Consistent on both sides, so only the numbers can tell.
    both_passes(h.plan, 1, [](PassPlan& p) { p.comm.stages[0].qo.input_groups[0] = 1; });
    both_passes(h.plan, 0, [](PassPlan& p) { p.comm.stages[0].qo.output_groups[0] = 1; });
    const Outcome o = run_numeric(h.problem, h.plan);
    INFO(o.str());
    CHECK(o.faults.empty());
    CHECK(o.err.max() > kTol);
  }
  SUBCASE("the wrong rows travel") {
    HandPlan h = hand_plan();
    both_passes(h.plan, 0, [](PassPlan& p) { p.comm.stages[0].kv.input_ranges[0] = {1, 8}; p.comm.stages[0].kv.input_split_sizes[0] = 7; });
    both_passes(h.plan, 1, [](PassPlan& p) {
      p.comm.stages[0].kv.output_split_sizes[0] = 7;
      p.comm.stages[0].num_remote_kv_tokens = 7;
      p.calc.remote_attn_args[0][1].k = {0, 7};
    });
    const Outcome o = run_numeric(h.problem, h.plan);
    INFO(o.str());
    CHECK_FALSE(o.passed());
  }
  SUBCASE("outputs never reduced") {
    HandPlan h = hand_plan();
    for (int r = 0; r < 2; ++r) both_passes(h.plan, r, [](PassPlan& p) { p.comm.stages[0].qo_reduce_after = 0; });
    const Outcome o = run_numeric(h.problem, h.plan);
    INFO(o.str());
    CHECK_FALSE(o.passed());
  }
  SUBCASE("an arg outside its buffer") {
    HandPlan h = hand_plan();
    both_passes(h.plan, 0, [](PassPlan& p) { p.calc.remote_attn_args[0][0].q = {0, 8}; });
    const Outcome o = run_numeric(h.problem, h.plan);
    INFO(o.str());
    CHECK_FALSE(o.faults.empty());
  }
}

namespace {

struct Solvers {
  Registry reg;
  AreaCostModel cost;
  std::vector<std::pair<std::string, std::unique_ptr<Solver>>> list;
  Solvers() {
    reg.scan(CPSCHED_PLUGIN_BUILD_DIR);
    for (const std::string name : {"owner", "usp", "static", "binary_greedy"}) {
      const PluginInfo* info = nullptr;
      for (const PluginInfo& p : reg.plugins())
        if (p.kind == PluginKind::solver && p.name == name) info = &p;
      if (info == nullptr) {
        MESSAGE("solver '", name, "' is not built in ", CPSCHED_PLUGIN_BUILD_DIR, ": skipped");
        continue;
      }
      list.emplace_back(name, reg.make_solver(name, reg.resolve_params(*info, {})));
    }
  }
  Assignment solve(const std::string& name, const std::shared_ptr<const TaskGrid>& grid) {
    for (auto& [n, s] : list)
      if (n == name) return test::host_solve(*s, grid, cost).assignment;
    throw Error("no solver " + name);
  }
};

}  // namespace

TEST_CASE("every solver x mask generator x P in {2, 3, 4, 8} x stages {1, 2}: equal to the reference") {
  Solvers solvers;
  std::mt19937_64 rng(77);
  int runs = 0;
  for (auto& [name, solver] : solvers.list)
    for (const std::string& kind_name : mask_kind_names()) {
      MaskKind kind{};
      REQUIRE(parse_mask_kind(kind_name, kind));
      for (int P : {2, 3, 4, 8}) {
        auto grid = test::random_grid(kind, P, Heads{4, 2, 8, 2}, rng);  // uneven shards
        const Solution a_sol = test::host_solve(*solver, grid, solvers.cost);
        const Assignment& a = a_sol.assignment;
        for (int stages : {1, 2}) {
          CAPTURE(name);
          CAPTURE(kind_name);
          CAPTURE(P);
          CAPTURE(stages);
          const Plan plan = build_plan(a, stages);
          const Outcome o = run_numeric(grid->problem(), plan);
          INFO(o.str());
          CHECK(o.passed());
          ++runs;
        }
      }
    }
  MESSAGE(runs, " plans checked numerically");
}

TEST_CASE("the fixed layout: every solver that keeps it (and the default) x mask generator x P in {2, 3, 4, 8}") {
  // The tokens stay on their sequential shards (static refuses: it dispatches).
  Solvers solvers;
  Registry& reg = solvers.reg;
  std::unique_ptr<Solver> bb;
  for (const PluginInfo& p : reg.plugins())
    if (p.kind == PluginKind::solver && p.name == "balanced_bytes") bb = reg.make_solver(p.name, reg.resolve_params(p, {}));
  std::vector<std::pair<std::string, Solver*>> list;
  for (auto& [name, solver] : solvers.list)
    if (name != "static") list.emplace_back(name, solver.get());
  if (bb) list.emplace_back("balanced_bytes", bb.get());
  std::mt19937_64 rng(78);
  int runs = 0;
  for (const auto& [name, solver] : list)
    for (const std::string& kind_name : mask_kind_names()) {
      MaskKind kind{};
      REQUIRE(parse_mask_kind(kind_name, kind));
      for (int P : {2, 3, 4, 8}) {
        auto grid = test::random_grid(kind, P, Heads{4, 2, 8, 2}, rng, Layout::fixed);
        for (const PlanUses uses : {PlanUses{1}, PlanUses::ahead()}) {
          const Solution sol = SolvePath(*solver, solvers.cost, reg).solve(grid, PlanShape{2}, uses);
          CAPTURE(name);
          CAPTURE(kind_name);
          CAPTURE(P);
          CAPTURE(uses.str());
          CHECK(sol.assignment.grid->sharding().same_layout(grid->sharding()));
          const Outcome o = run_numeric(grid->problem(), build_plan(sol.assignment, 2));
          INFO(o.str());
          CHECK(o.passed());
          ++runs;
        }
      }
    }
  MESSAGE(runs, " fixed-layout plans checked numerically");
}

TEST_CASE("unflattened head groups and several blocks per rank") {
  Solvers solvers;
  std::mt19937_64 rng(5);
  for (auto& [name, solver] : solvers.list) {
    for (bool flatten : {false, true})
      for (int blocks : {1, 3}) {
        if (name == "usp" && !flatten) continue;  // usp needs flattened groups (docs/design.md#solvers)
        const int P = 3;
        const Token S = 40;
        const RangeMask mask = make_mask(test::random_spec(MaskKind::causal_document, S, rng), S);
        auto problem = test::planned(Problem::make(mask, P, Heads{6, 3, 4, 2}, {flatten, blocks}));
        auto grid = std::make_shared<const TaskGrid>(problem);
        const Solution a_sol = test::host_solve(*solver, grid, solvers.cost);
        const Assignment& a = a_sol.assignment;
        CAPTURE(name);
        CAPTURE(flatten);
        CAPTURE(blocks);
        const Outcome o = run_numeric(*problem, build_plan(a, 2));
        INFO(o.str());
        CHECK(o.passed());
      }
  }
}

namespace {

// The builder's plan of a problem where every rank receives something.
struct BuiltPlan {
  std::shared_ptr<const Problem> problem;
  Plan plan;
};

BuiltPlan built_plan(Solvers& solvers) {
  const Token S = 50;
  const int P = 4;
  MaskSpec spec;
  spec.kind = MaskKind::causal;
  auto problem =
      test::planned(Problem::make(make_mask(spec, S), P, Heads{4, 2, 8, 2}, {true, 1}));
  auto grid = std::make_shared<const TaskGrid>(problem);
  // binary_greedy moves both QO and KV; any solver moves KV here.
  std::string name = solvers.list.front().first;
  for (const auto& [n, s] : solvers.list)
    if (n == "binary_greedy") name = n;
  return {problem, build_plan(solvers.solve(name, grid), 1)};
}

// A (src, input split, dst) of a KV group-cast of stage 1 in the forward pass.
struct Pick {
  int src = -1, split = -1, dst = -1;
};
Pick first_kv_transfer(const Plan& plan) {
  for (int r = 0; r < static_cast<int>(plan.ranks.size()); ++r) {
    const GroupCollectiveArg& kv = plan.ranks[static_cast<std::size_t>(r)].fwd.comm.stages[0].kv;
    for (std::size_t i = 0; i < kv.dst_indices.size(); ++i)
      if (!kv.dst_indices[i].empty()) return {r, static_cast<int>(i), kv.dst_indices[i][0]};
  }
  return {};
}

}  // namespace

TEST_CASE("a builder plan with one transfer removed or added fails the check") {
  Solvers solvers;
  if (solvers.list.empty()) return;
  BuiltPlan b = built_plan(solvers);
  REQUIRE(run_numeric(*b.problem, b.plan).passed());
  const Pick pick = first_kv_transfer(b.plan);
  REQUIRE(pick.src >= 0);
  CAPTURE(pick.src);
  CAPTURE(pick.dst);

  SUBCASE("removed on the sending side only") {
    auto& dsts = b.plan.ranks[static_cast<std::size_t>(pick.src)].fwd.comm.stages[0].kv.dst_indices
                     [static_cast<std::size_t>(pick.split)];
    dsts.erase(dsts.begin());
    const Outcome o = run_numeric(*b.problem, b.plan);
    INFO(o.str());
    CHECK_FALSE(o.passed());
    CHECK_FALSE(o.faults.empty());
  }
  SUBCASE("removed on both sides (a consistent but incomplete plan)") {
    GroupCollectiveArg& out = b.plan.ranks[static_cast<std::size_t>(pick.src)].fwd.comm.stages[0].kv;
    auto& dsts = out.dst_indices[static_cast<std::size_t>(pick.split)];
    dsts.erase(dsts.begin());
    // The receiver's output split for it: the k-th from src, k = rank of this split among src's splits to dst.
    int k = 0;
    for (int i = 0; i < pick.split; ++i)
      for (Rank d : out.dst_indices[static_cast<std::size_t>(i)]) k += d == pick.dst;
    StageComm& sc = b.plan.ranks[static_cast<std::size_t>(pick.dst)].fwd.comm.stages[0];
    GroupCollectiveArg& in = sc.kv;
    for (std::size_t j = 0; j < in.src_index.size(); ++j)
      if (in.src_index[j] == pick.src && k-- == 0) {
        sc.num_remote_kv_tokens -= in.output_split_sizes[j];
        in.output_split_sizes.erase(in.output_split_sizes.begin() + static_cast<std::ptrdiff_t>(j));
        in.src_index.erase(in.src_index.begin() + static_cast<std::ptrdiff_t>(j));
        in.output_groups.erase(in.output_groups.begin() + static_cast<std::ptrdiff_t>(j));
        break;
      }
    const Outcome o = run_numeric(*b.problem, b.plan);
    INFO(o.str());
    CHECK_FALSE(o.passed());
  }
  SUBCASE("an extra transfer nobody reads") {
    // Rank src also sends the split to a rank that does not need it, and
    // that rank expects it: consistent, numerically harmless, still a defect.
    const int P = static_cast<int>(b.plan.ranks.size());
    GroupCollectiveArg& out = b.plan.ranks[static_cast<std::size_t>(pick.src)].fwd.comm.stages[0].kv;
    int extra = -1;
    for (int d = 0; d < P && extra < 0; ++d) {
      const auto& dsts = out.dst_indices[static_cast<std::size_t>(pick.split)];
      if (d != pick.src && std::find(dsts.begin(), dsts.end(), d) == dsts.end()) extra = d;
    }
    REQUIRE(extra >= 0);
    out.input_split_sizes.push_back(1);
    out.input_ranges.push_back({0, 1});
    out.input_groups.push_back(0);
    out.dst_indices.push_back({extra});
    StageComm& sc = b.plan.ranks[static_cast<std::size_t>(extra)].fwd.comm.stages[0];
    sc.kv.output_split_sizes.push_back(1);
    sc.kv.src_index.push_back(pick.src);
    sc.kv.output_groups.push_back(0);
    sc.num_remote_kv_tokens += 1;
    const Outcome o = run_numeric(*b.problem, b.plan);
    INFO(o.str());
    CHECK_FALSE(o.passed());
  }
}

TEST_CASE("run_sim in numeric mode reports the check, its errors and the timeline") {
  const HandPlan h = hand_plan();
  auto problem = std::make_shared<const Problem>(h.problem);
  ExecuteInput in;
  in.problem = problem;
  in.plan = &h.plan;
  in.seed = 5;
  SimOptions opt = parse_sim_options(Params({{"mode", std::string("numeric")}}));
  const ExecutionReport rep = run_sim(in, opt);
  INFO(rep.text);
  CHECK(rep.passed);
  CHECK(rep.text.find("numeric check PASSED") != std::string::npos);
  CHECK(rep.text.find("dV") != std::string::npos);
  CHECK(rep.svg.find("<svg") == 0);
  REQUIRE(!rep.figures.empty());
  CHECK(rep.figures.entries()[0].first == "numeric_passed");
  CHECK(rep.figures.entries()[0].second == 1.0);

  Plan broken = h.plan;
  broken.ranks[0].bwd.comm.stages[0].kv.dst_indices[0].clear();
  in.plan = &broken;
  const ExecutionReport bad = run_sim(in, opt);
  INFO(bad.text);
  CHECK_FALSE(bad.passed);
  CHECK(bad.text.find("numeric check FAILED") != std::string::npos);
  CHECK(bad.text.find("plan faults") != std::string::npos);
}

TEST_CASE("numeric mode refuses a problem too large for memory, naming the sizes") {
  HandPlan h = hand_plan();
  h.problem.heads = Heads{64, 8, 128, 2};
  auto problem = std::make_shared<const Problem>(h.problem);
  ExecuteInput in;
  in.problem = problem;
  in.plan = &h.plan;
  SimOptions opt = parse_sim_options(Params({{"mode", std::string("numeric")}, {"max_numeric_gib", 1e-6}}));
  CHECK_THROWS_WITH_AS(run_sim(in, opt), doctest::Contains("max_numeric_gib"), Error);
}

TEST_CASE("a builder plan gives the same bits with ranks run in parallel or one after another") {
  Solvers solvers;
  if (solvers.list.empty()) return;
  const BuiltPlan b = built_plan(solvers);  // P = 4: with 4 threads the ranks run in parallel
  const GlobalInputs in = GlobalInputs::generate(*b.problem, 9);
  const VirtualRun serial = run_virtual_ranks(*b.problem, b.plan, in, 1);
  const VirtualRun parallel = run_virtual_ranks(*b.problem, b.plan, in, 4);
  CHECK(serial.outputs.o == parallel.outputs.o);
  CHECK(serial.outputs.lse == parallel.outputs.lse);
  CHECK(serial.outputs.dq == parallel.outputs.dq);
  CHECK(serial.outputs.dv == parallel.outputs.dv);
}

TEST_CASE("the default solver's step-time objective: every generator x P in {2, 3, 4, 8} x stages {1, 2, auto}") {
  Registry reg;
  reg.scan(CPSCHED_PLUGIN_BUILD_DIR);
  const PluginInfo* info = nullptr;
  for (const PluginInfo& p : reg.plugins())
    if (p.kind == PluginKind::solver && p.name == "balanced_bytes") info = &p;
  if (info == nullptr) {
    MESSAGE("balanced_bytes is not built: skipped");
    return;
  }
  auto solver = reg.make_solver("balanced_bytes", reg.resolve_params(*info, Params({{"objective", std::string("time")}})));
  // Two GPUs per node, so that P >= 3 has NVLink and NIC peers.
  HardwareProfile hw = resolve_hardware_profile("cluster_8gpu_ib");
  hw.gpus_per_node = 2;
  const TimeCostModel cost(hw);
  std::mt19937_64 rng(91);
  int runs = 0;
  for (const std::string& kind_name : mask_kind_names()) {
    MaskKind kind{};
    REQUIRE(parse_mask_kind(kind_name, kind));
    for (int P : {2, 3, 4, 8}) {
      auto grid = test::random_grid(kind, P, Heads{4, 2, 8, 2}, rng);
      for (int stages : {1, 2, 0}) {
        const Solution a_sol = test::host_solve(*solver, grid, cost, test::shape(stages));
        const Assignment& a = a_sol.assignment;
        CAPTURE(kind_name);
        CAPTURE(P);
        CAPTURE(stages);
        if (stages == 0) CHECK((a_sol.shape.stages >= 1 && a_sol.shape.stages <= 3));
        const Plan plan = build_plan(a, stages > 0 ? stages : a_sol.shape.stages);
        const Outcome o = run_numeric(a.grid->problem(), plan);
        INFO(a_sol.note);
        INFO(o.str());
        CHECK(o.passed());
        ++runs;
      }
    }
  }
  MESSAGE(runs, " step-time plans checked numerically");
}
