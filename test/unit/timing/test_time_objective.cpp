// The time cost model and the default solver's step-time objective: prices
// in seconds by link class (forward + backward), whole plans priced by the
// timing model, and `balanced_bytes` with objective time never slower than
// the plans it starts from, deterministic for any thread count, and exactly
// its bytes behaviour under the seed's `area` model.
#include <doctest/doctest.h>

#include <random>

#include "cpsched/plugin/cost_model.hpp"
#include "plan_fixtures.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/pricing/host_pricing.hpp"
#include "cpsched/plugin/registry.hpp"
#include "cpsched/timing/model.hpp"
#include "host_solve.hpp"
#include "random_specs.hpp"

using namespace cpsched;

namespace {

struct Plugins {
  Registry reg;
  Plugins() { reg.scan(CPSCHED_PLUGIN_BUILD_DIR); }
  bool has(PluginKind k, const std::string& name) const {
    for (const PluginInfo& p : reg.plugins())
      if (p.kind == k && p.name == name) return true;
    return false;
  }
  std::unique_ptr<Solver> solver(const std::string& name, Params given = {}) {
    return reg.make_solver(name, reg.resolve_params(reg.find(PluginKind::solver, name), given));
  }
};

// Profile with 2 GPUs per node: small P spans nodes.
HardwareProfile two_per_node() {
  HardwareProfile hw = resolve_hardware_profile("cluster_8gpu_ib");
  hw.gpus_per_node = 2;
  return hw;
}

double step_of(const CostModel& cost, const Assignment& a, int stages) {
  return estimate_step(a.grid->problem(), build_plan(a, stages), *cost.hardware()).step();
}

Solution solve(Solver& s, std::shared_ptr<const TaskGrid> g, const CostModel& c, int stages = 1, int relay = 0) {
  return test::host_solve(s, std::move(g), c, test::shape(stages, relay));
}

}  // namespace

TEST_CASE("time cost model: compute in seconds, transfers by link class, forward and backward") {
  const HardwareProfile hw = two_per_node();
  const TimeCostModel m(hw);
  auto problem = std::make_shared<const Problem>(
      Problem::make(RangeMask(64, {{{0, 64}, {0, 64}, MaskType::full}}), 4, Heads{8, 2, 16, 2}, {true, 1}));
  const TaskGrid grid(problem);
  const TaskId t = 0;
  // FLOPs 4 x load x D forward, 2.5 x that backward.
  const double fwd = 4.0 * static_cast<double>(grid.load(t)) * 16;
  CHECK(m.compute(grid, t) == doctest::Approx(fwd / (hw.fwd_tflops * 1e12) + 2.5 * fwd / (hw.bwd_tflops * 1e12)));
  // KV of one group (1 kv head): K,V out fwd + bwd, dK,dV back bwd: 6 x D x b per token.
  const double kv_bytes = 10.0 * 6 * 16 * 2;
  CHECK(m.transfer(grid, RowKind::kv, 10, 1, 0, 1) ==
        doctest::Approx(kv_bytes / (hw.intra_node.bandwidth_gb_s * 1e9)));
  CHECK(m.transfer(grid, RowKind::kv, 10, 1, 0, 2) ==
        doctest::Approx(kv_bytes / (hw.inter_node.bandwidth_gb_s * 1e9)));
  CHECK(m.transfer(grid, RowKind::kv, 10, 1, 3, 3) == 0.0);
  // Q (4 q heads per group): Q out, O + lse back fwd; Q, O, dO, lse out, dQ back bwd.
  const double qo_bytes = 10.0 * 4 * (16 * 2 + (16 * 2 + 4) + (3 * 16 * 2 + 4) + 16 * 2);
  CHECK(m.transfer(grid, RowKind::qo, 10, 4, 1, 2) ==
        doctest::Approx(qo_bytes / (hw.inter_node.bandwidth_gb_s * 1e9)));
  const TimePrices p = time_prices(*m.hardware());
  CHECK(p.link_class(0, 1) == 0);
  CHECK(p.link_class(1, 2) == 1);
  CHECK(AreaCostModel().hardware() == nullptr);
}

TEST_CASE("the built-in `time` model takes its profile by name; the host prices plans on it as the timing model does") {
  Plugins pl;
  if (!pl.has(PluginKind::solver, "owner")) {
    MESSAGE("owner plugin not built: skipped");
    return;
  }
  const PluginInfo& info = pl.reg.find(PluginKind::cost_model, "time");
  CHECK(info.built_in);
  auto cost = pl.reg.make_cost_model("time", pl.reg.resolve_params(info, Params({{"hardware", std::string("h200_8x_nvlink")}})));
  REQUIRE(cost->hardware() != nullptr);
  const HardwareProfile hw = resolve_hardware_profile("h200_8x_nvlink");
  CHECK(time_prices(*cost->hardware()).flop_s[0] == doctest::Approx(1.0 / (hw.fwd_tflops * 1e12)));
  std::mt19937_64 rng(3);
  auto grid = test::random_grid(MaskKind::causal_document, 16, Heads{8, 2, 16, 2}, rng);
  const Assignment a = solve(*pl.solver("owner"), grid, *cost).assignment;
  PlanOptions po{2, 0};
  po.hardware = cost->hardware();  // the stage cut the host prices on (plan/builder.hpp)
  po.timer = &timing_model_timer();
  const Plan plan = build_plan(a, po);
  // The host's pricing service: the price sheet's step is the full plan's.
  HostPricing pricing(*cost->hardware());
  const PlanPrice e = pricing.price(pricing.add(grid, a.rank), PlanShape::fixed(2));
  const StepEstimate ref = estimate_step(grid->problem(), plan, hw);
  CHECK(e.step == ref.step());
  // (The pricing's bound is the compute at the kernels' rates: the floor.)
  REQUIRE(hw.kernel);
  CHECK(e.compute_bound == doctest::Approx(ref.compute_floor).epsilon(1e-12));
  CHECK(ref.compute_floor > ref.compute_bound);
  CHECK_THROWS_WITH_AS(pl.reg.make_cost_model("time", pl.reg.resolve_params(info, Params({{"hardware", std::string("a100")}}))),
                       doctest::Contains("unknown hardware profile 'a100'"), Error);
}

TEST_CASE("objective time: never slower than owner, usp and its members; same plan for 1 and 4 threads") {
  Plugins pl;
  for (const char* n : {"balanced_bytes", "owner", "usp", "binary_greedy", "static"})
    if (!pl.has(PluginKind::solver, n)) {
      MESSAGE(n, " not built: skipped");
      return;
    }
  const TimeCostModel cost(two_per_node());
  auto t1 = pl.solver("balanced_bytes", Params({{"objective", std::string("time")}, {"threads", std::int64_t{1}}}));
  auto t4 = pl.solver("balanced_bytes", Params({{"objective", std::string("time")}, {"threads", std::int64_t{4}}}));
  std::mt19937_64 rng(17);
  int cases = 0;
  for (MaskKind kind : {MaskKind::causal_document, MaskKind::full_document, MaskKind::causal, MaskKind::sliding_window})
    for (int P : {2, 3, 5, 8}) {
      auto grid = test::random_grid(kind, P, Heads{4, 2, 8, 2}, rng);
      const Solution a = solve(*t1, grid, cost, 1);
      a.assignment.validate();
      CAPTURE(P);
      INFO(a.note);
      const Solution b = solve(*t4, grid, cost, 1);
      CHECK(a.assignment.rank == b.assignment.rank);
      // Choosing stages and relays (bounds, batches, parallel members and
      // pricing) gives the same choice for any thread count too.
      const Solution c1 = solve(*t1, grid, cost, 0, -1);
      const Solution c4 = solve(*t4, grid, cost, 0, -1);
      CHECK(c1.assignment.rank == c4.assignment.rank);
      CHECK(c1.shape.stages == c4.shape.stages);
      CHECK(c1.shape.node_size == c4.shape.node_size);
      CHECK(c1.assignment.grid->sharding().blocks == c4.assignment.grid->sharding().blocks);
      const double mine = step_of(cost, a.assignment, 1);
      for (const char* other : {"owner", "usp", "binary_greedy", "static", "balanced_bytes"}) {
        // balanced_bytes here: its bytes objective.
        const std::string name = other;
        const Solution o = name == "balanced_bytes"
                                 ? solve(*pl.solver(name, Params({{"objective", std::string("bytes")}})), grid, cost, 1)
                                 : solve(*pl.solver(name), grid, cost, 1);
        CAPTURE(other);
        // Every start's and member's plan is a candidate judged by its step
        // time, so the result is never slower than any of them.
        CHECK(mine <= step_of(cost, o.assignment, 1) * (1 + 1e-9));
      }
      ++cases;
    }
  MESSAGE(cases, " problems");
}

TEST_CASE("settle: pricing stops once a plan is within settle of the compute floor, which no plan beats") {
  Plugins pl;
  if (!pl.has(PluginKind::solver, "balanced_bytes")) return;
  // One full sequence over 8 ranks, 8 per node (NVLink only): owner's plan
  // hides all communication, so the probe settles it.
  const TimeCostModel cost(resolve_hardware_profile("h100_8x_nvlink"));
  auto problem = test::planned(
      Problem::make(RangeMask(8 * 8192, {{{0, 8 * 8192}, {0, 8 * 8192}, MaskType::full}}), 8, Heads{64, 8, 128, 2}));
  auto grid = std::make_shared<const TaskGrid>(problem);
  const Solution a = solve(*pl.solver("balanced_bytes"), grid, cost, 0, -1);
  INFO(a.note);
  CHECK(a.note.find("within 1 % of the compute bound, so no member grid was searched") != std::string::npos);
  const StepEstimate e = test::plan_step(cost, a, test::shape(0, -1));
  // (Under the profile's kernel model: of the compute at the kernels' rates.)
  CHECK(e.step() <= 1.01 * e.compute_floor);
  // settle 0 prices every candidate: at most 1 % faster, never slower than the bound.
  const Solution b = solve(*pl.solver("balanced_bytes", Params({{"settle", 0.0}})), grid, cost, 0, -1);
  INFO(b.note);
  CHECK(b.note.find("compute bound") == std::string::npos);
  const StepEstimate f = test::plan_step(cost, b, test::shape(0, -1));
  CHECK(f.step() >= f.compute_floor);
  CHECK(f.compute_floor >= f.compute_bound);
  CHECK(e.step() <= 1.01 * f.step());
  CHECK(f.compute_bound == doctest::Approx(e.compute_bound).epsilon(1e-12));
  CHECK_THROWS_WITH_AS(pl.solver("balanced_bytes", Params({{"settle", 1.0}})),
                       doctest::Contains("balanced_bytes: settle = 1 must be in [0, 1)"), Error);
}

TEST_CASE("objective auto: time under a time model, exactly bytes under area; time needs a time model") {
  Plugins pl;
  if (!pl.has(PluginKind::solver, "balanced_bytes")) return;
  std::mt19937_64 rng(5);
  auto grid = test::random_grid(MaskKind::causal_document, 4, Heads{4, 2, 8, 2}, rng);
  const AreaCostModel area;
  const Solution a = solve(*pl.solver("balanced_bytes"), grid, area);
  const Solution b = solve(*pl.solver("balanced_bytes", Params({{"objective", std::string("bytes")}})), grid, area);
  CHECK(a.assignment.rank == b.assignment.rank);
  CHECK(a.note.find("(bytes)") != std::string::npos);
  const TimeCostModel time(two_per_node());
  const Solution c = solve(*pl.solver("balanced_bytes"), grid, time, 0);
  CHECK(c.note.find("(time)") != std::string::npos);
  CHECK((c.shape.stages >= 1 && c.shape.stages <= 5));
  CHECK_THROWS_WITH_AS(solve(*pl.solver("balanced_bytes", Params({{"objective", std::string("time")}})), grid, area),
                       doctest::Contains("needs a cost model that prices time"), Error);
  CHECK_THROWS_WITH_AS(pl.solver("balanced_bytes", Params({{"objective", std::string("fast")}})),
                       doctest::Contains("objective = 'fast' is not one of"), Error);
  const Solution d =
      solve(*pl.solver("balanced_bytes", Params({{"objective", std::string("bottleneck")}})), grid, area);
  d.assignment.validate();
  CHECK(d.note.find("(bottleneck)") != std::string::npos);
}

TEST_CASE("a huge mu is no cap and does not hang") {
  Plugins pl;
  if (!pl.has(PluginKind::solver, "balanced_bytes")) return;
  std::mt19937_64 rng(8);
  auto grid = test::random_grid(MaskKind::causal, 4, Heads{4, 2, 8, 2}, rng);
  const AreaCostModel area;
  const Solution a = solve(*pl.solver("balanced_bytes", Params({{"mu", 1e12}})), grid, area);
  a.assignment.validate();
  CHECK(a.feasible);
}

TEST_CASE("static's two-level dispatch keeps each node chunk inside one node; one level as published by default") {
  Plugins pl;
  if (!pl.has(PluginKind::solver, "static")) return;
  const int P = 8;
  const Token S = 8 * 1024;
  const RangeMask mask = make_mask(MaskSpec{}, S);  // default spec: causal
  auto problem = test::planned(Problem::make(mask, P, Heads{4, 2, 8, 2}));
  auto grid = std::make_shared<const TaskGrid>(problem);
  const TimeCostModel cost(two_per_node());  // 4 nodes of 2 ranks
  const Solution two = solve(*pl.solver("static", Params({{"node_ranks", std::int64_t{-1}}})), grid, cost);
  two.assignment.validate();
  CHECK(two.note.find("two levels") != std::string::npos);
  // Node chunks of S / (4 node_chunks x 4 nodes) = 512 tokens: each lies on one node.
  const Sharding& sh = two.assignment.grid->sharding();
  std::vector<Token> per_rank(P, 0);
  for (std::size_t b = 0; b < sh.blocks.size(); ++b) per_rank[static_cast<std::size_t>(sh.host[b])] += sh.blocks[b].size();
  for (Token t = 0; t < S; t += 512) {
    const int node = sh.host[static_cast<std::size_t>(sh.block_of(t))] / 2;
    for (Token u = t; u < t + 512; u += 128) CHECK(sh.host[static_cast<std::size_t>(sh.block_of(u))] / 2 == node);
  }
  for (Token n : per_rank) CHECK(n == S / P);  // equal chunk counts
  for (TaskId t = 0; t < two.assignment.grid->num_tasks(); ++t) CHECK(two.assignment.rank[static_cast<std::size_t>(t)] == two.assignment.grid->q_host(t));
  // Under the seed's area model (no nodes) node_ranks = -1 is the one-level dispatch.
  const AreaCostModel area;
  const Solution flat = solve(*pl.solver("static"), grid, area);
  const Solution auto_flat = solve(*pl.solver("static", Params({{"node_ranks", std::int64_t{-1}}})), grid, area);
  CHECK(flat.assignment.grid->sharding().blocks == auto_flat.assignment.grid->sharding().blocks);
  CHECK(flat.assignment.grid->sharding().host == auto_flat.assignment.grid->sharding().host);
  // chunks_per_rank: finer chunks, same tokens per rank.
  const Solution fine = solve(*pl.solver("static", Params({{"chunks_per_rank", std::int64_t{16}}})), grid, area);
  CHECK(fine.note.find("128 chunks of 64 tokens") != std::string::npos);
  CHECK_THROWS_WITH_AS(pl.solver("static", Params({{"node_ranks", std::int64_t{-2}}})), doctest::Contains("node_ranks"), Error);
}

TEST_CASE("kernel model: made ahead across nodes, the default stops choosing finer grids where they no longer pay") {
  Plugins pl;
  if (!pl.has(PluginKind::solver, "balanced_bytes")) return;
  // causal_document pack 0 at P = 16 (two nodes), fixed layout: on the
  // profile without its kernel table the full search's repetition on finer
  // blocks wins (test_balanced_bytes_uses pins it); priced as the kernels run
  // them, cutting the documents' args finer costs more than it saves.
  MaskSpec spec;
  spec.kind = MaskKind::causal_document;
  spec.histogram = DocHistogram::load_csv(std::string(CPSCHED_SOURCE_DIR) + "/configs/data/doc_length_distribution.csv");
  spec.seed = 42;
  const int P = 16;
  Problem made = Problem::make(make_mask(spec, Token{8192} * P), P, Heads{64, 8, 128, 2});
  made.set_layout(Layout::fixed);
  const auto problem = std::make_shared<const Problem>(std::move(made));
  const HardwareProfile hw = resolve_hardware_profile("h100_8x_nvlink");
  REQUIRE(hw.kernel);
  HardwareProfile flat = hw;
  flat.kernel.reset();
  const TimeCostModel with(hw), without(flat);
  auto bb = pl.solver("balanced_bytes");
  const SolvePath::Options o{.shape = test::shape(0, -1), .uses = PlanUses::ahead()};
  const SolveResult old_plan = SolvePath(*bb, without, pl.reg).run(problem, o);
  const SolveResult new_plan = SolvePath(*bb, with, pl.reg).run(problem, o);
  INFO(old_plan.note);
  INFO(new_plan.note);
  CHECK(old_plan.assignment->grid->problem().grid.blocks_per_rank > 1);
  CHECK(new_plan.assignment->grid->problem().grid.blocks_per_rank == 1);
  const double old_step = estimate_step(old_plan.assignment->grid->problem(), *old_plan.plan, hw).step();
  const double new_step = estimate_step(new_plan.assignment->grid->problem(), *new_plan.plan, hw).step();
  CHECK(new_step < old_step);
  // The solver's own figure is the plan's price under the kernel model.
  CHECK(new_plan.figures.get("predicted_step_s").value_or(0) == doctest::Approx(new_step).epsilon(1e-9));
}

TEST_CASE("kernel model: the default's plan is never slower than the one made without it, used once and made ahead") {
  // Today's plan is made on the profile without its kernel table; under the
  // table the default decides as there and takes the fastest under the kernel
  // model of the plans it priced (plugins/balanced_bytes/kernel_pick.hpp), so
  // priced with the table its plan is never slower. One and two nodes, both
  // layouts, the document masks, a few packs each (docs/bounds.md has 20 to
  // 128 ranks: bench_step_time --kernel-compare).
  Plugins pl;
  if (!pl.has(PluginKind::solver, "balanced_bytes")) return;
  const HardwareProfile hw = resolve_hardware_profile("h100_8x_nvlink");
  REQUIRE(hw.kernel);
  HardwareProfile flat = hw;
  flat.kernel.reset();
  const TimeCostModel with(hw), without(flat);
  auto bb = pl.solver("balanced_bytes");
  const DocHistogram hist =
      DocHistogram::load_csv(std::string(CPSCHED_SOURCE_DIR) + "/configs/data/doc_length_distribution.csv");
  int cases = 0, faster = 0;
  for (const bool ahead : {false, true})
    for (const Layout layout : {Layout::fixed, Layout::planned})
      for (const MaskKind kind : {MaskKind::causal_document, MaskKind::full_document})
        for (const int P : {8, 16})
          for (int pack = 0; pack < (ahead ? 1 : 3); ++pack) {
            if (ahead && (P == 16) != (kind == MaskKind::causal_document)) continue;  // (kept short)
            MaskSpec spec;
            spec.kind = kind;
            spec.histogram = hist;
            spec.seed = 42;
            spec.pack = pack;
            Problem made = Problem::make(make_mask(spec, Token{8192} * P), P, Heads{64, 8, 128, 2});
            made.set_layout(layout);
            const auto problem = std::make_shared<const Problem>(std::move(made));
            const SolvePath::Options o{.shape = test::shape(0, -1),
                                       .uses = ahead ? PlanUses::ahead() : PlanUses{1}};
            const SolveResult old_plan = SolvePath(*bb, without, pl.reg).run(problem, o);
            const SolveResult new_plan = SolvePath(*bb, with, pl.reg).run(problem, o);
            CAPTURE(ahead);
            CAPTURE(P);
            CAPTURE(pack);
            CAPTURE(static_cast<int>(kind));
            CAPTURE(static_cast<int>(layout));
            INFO(old_plan.note);
            INFO(new_plan.note);
            const double old_step = estimate_step(old_plan.assignment->grid->problem(), *old_plan.plan, hw).step();
            const double new_step = estimate_step(new_plan.assignment->grid->problem(), *new_plan.plan, hw).step();
            CHECK(new_step <= old_step * (1 + 1e-12));
            ++cases;
            faster += new_step < old_step * (1 - 1e-6);
          }
  MESSAGE(faster << " of " << cases << " plans faster than today's under the kernel model");
  CHECK(cases == 28);
}

TEST_CASE("static under a kernel model cuts documents at tile multiples; without one its dispatch is as published") {
  Plugins pl;
  if (!pl.has(PluginKind::solver, "static")) return;
  const HardwareProfile hw = resolve_hardware_profile("h100_8x_nvlink");
  REQUIRE(hw.kernel);
  HardwareProfile flat = hw;
  flat.kernel.reset();
  const TimeCostModel with(hw), without(flat);
  const AreaCostModel area;
  const DocHistogram hist =
      DocHistogram::load_csv(std::string(CPSCHED_SOURCE_DIR) + "/configs/data/doc_length_distribution.csv");
  const int P = 8;
  const Token chunk = 1024;  // S / (8 P)
  double old_sum = 0, new_sum = 0;
  for (int pack = 0; pack < 4; ++pack) {
    MaskSpec spec;
    spec.kind = MaskKind::causal_document;
    spec.histogram = hist;
    spec.seed = 42;
    spec.pack = pack;
    auto problem = test::planned(Problem::make(make_mask(spec, Token{8192} * P), P, Heads{64, 8, 128, 2}));
    auto grid = std::make_shared<const TaskGrid>(problem);
    auto st = pl.solver("static");
    const Solution a = solve(*st, grid, area), f = solve(*st, grid, without), k = solve(*st, grid, with);
    // Without a kernel model: the same dispatch as under the area model, cut every `chunk` tokens.
    CHECK(f.assignment.grid->sharding().blocks == a.assignment.grid->sharding().blocks);
    CHECK(f.assignment.grid->sharding().host == a.assignment.grid->sharding().host);
    for (const Range& b : f.assignment.grid->sharding().blocks) CHECK(b.begin % chunk == 0);
    CHECK(f.figures.get("tile_aligned").value_or(-1) == 0);
    // With one: every cut within 64 tokens of the published one, inside a document at a multiple of 128 from its start.
    CHECK(k.figures.get("tile_aligned").value_or(0) == 128);
    std::vector<Token> starts;
    for (const Slice& s : problem->mask.slices()) starts.push_back(s.q.begin);
    starts.push_back(problem->seqlen());
    std::sort(starts.begin(), starts.end());
    for (const Range& b : k.assignment.grid->sharding().blocks) {
      const Token near = (b.begin + chunk / 2) / chunk * chunk;
      CHECK(std::abs(b.begin - near) <= 64);
      const Token doc = *(std::upper_bound(starts.begin(), starts.end(), b.begin) - 1);
      CHECK((b.begin - doc) % 128 == 0);
    }
    old_sum += estimate_step(*problem, build_plan(f.assignment, 1), hw).step();
    new_sum += estimate_step(*problem, build_plan(k.assignment, 1), hw).step();
  }
  MESSAGE("static's plans at one stage under the kernel model, 4 packs: " << old_sum * 1e3 << " ms as published, "
                                                                          << new_sum * 1e3 << " ms cut at tiles");
}
