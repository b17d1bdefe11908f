// The `balanced_bytes` solver: on random masks (P in {2, 3, 5, 8}) it is never
// worse than the members of its portfolio (owner, usp, binary_greedy) loaded
// as plugins, places every task exactly once, meets mu whenever a member does,
// splits shards when a cell alone breaks the balance, and gives the same
// result for any thread count.
#include <doctest/doctest.h>

#include <random>

#include "brute_force.hpp"
#include "host_solve.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/plan/validator.hpp"
#include "cpsched/plugin/registry.hpp"

using namespace cpsched;

namespace {

constexpr double kMu = 1.10;

std::string first(const std::vector<std::string>& v) { return v.empty() ? std::string() : v.front(); }

const PluginInfo* find_solver(const Registry& reg, const std::string& name) {
  for (const PluginInfo& p : reg.plugins())
    if (p.kind == PluginKind::solver && p.name == name) return &p;
  return nullptr;
}

std::unique_ptr<Solver> make(Registry& reg, const std::string& name, Params given = {}) {
  const PluginInfo* info = find_solver(reg, name);
  for (const ParamSpec& s : info->params)
    if (s.name == "mu") given.set("mu", kMu);
  return reg.make_solver(name, reg.resolve_params(*info, given));
}

// Load above the balance cap summed over ranks (0: meets mu), as the solver
// ranks candidates; the cap is the largest load with load x P / total <= mu.
std::int64_t excess(const Metrics& m) {
  std::int64_t total = 0;
  for (auto l : m.load) total += l;
  const double P = static_cast<double>(m.load.size());
  std::int64_t e = 0;
  for (auto l : m.load)
    if (static_cast<double>(l) * P / static_cast<double>(total) > kMu) {
      auto cap = static_cast<std::int64_t>(kMu * static_cast<double>(total) / P);
      while (static_cast<double>(cap + 1) * P / static_cast<double>(total) <= kMu) ++cap;
      while (static_cast<double>(cap) * P / static_cast<double>(total) > kMu) --cap;
      e += l - cap;
    }
  return e;
}

std::shared_ptr<const TaskGrid> random_grid(std::mt19937_64& rng, int P, int kind) {
  const Token S = P * (24 + static_cast<Token>(rng() % 16)) + static_cast<Token>(rng() % static_cast<std::uint64_t>(P));
  RangeMask mask;
  if (kind == 0) {
    mask = test::random_document_mask(S, rng);
  } else {
    MaskSpec spec;
    spec.kind = kind == 1 ? MaskKind::causal : (kind == 2 ? MaskKind::full : MaskKind::causal_document);
    if (kind == 3) {
      Token left = S;
      while (left > 0) {
        const Token n = std::min<Token>(left, 1 + static_cast<Token>(rng() % static_cast<std::uint64_t>(S / 2)));
        spec.lengths.push_back(n);
        left -= n;
      }
    }
    mask = make_mask(spec, S);
  }
  auto p = std::make_shared<const Problem>(Problem::make(mask, P, Heads{8, 4, 16, 2}, {true, 1}));
  return std::make_shared<const TaskGrid>(p);
}

}  // namespace

TEST_CASE("balanced_bytes is never worse than owner, usp or binary_greedy on random masks") {
  Registry reg;
  reg.scan(CPSCHED_PLUGIN_BUILD_DIR);
  if (find_solver(reg, "balanced_bytes") == nullptr) {
    MESSAGE("balanced_bytes is not built in ", CPSCHED_PLUGIN_BUILD_DIR, ": skipped");
    return;
  }
  auto bb = make(reg, "balanced_bytes");
  std::vector<std::pair<std::string, std::unique_ptr<Solver>>> members;
  for (const std::string name : {"owner", "usp", "binary_greedy"}) {
    if (find_solver(reg, name) == nullptr) {
      MESSAGE("solver '", name, "' is not built: left out of the comparison");
      continue;
    }
    members.emplace_back(name, make(reg, name));
  }
  REQUIRE(!members.empty());
  const AreaCostModel cost;
  std::mt19937_64 rng(88);
  int compared = 0;
  for (int P : {2, 3, 5, 8})
    for (int rep = 0; rep < 8; ++rep) {
      const auto grid = random_grid(rng, P, rep % 4);
      CAPTURE(P);
      CAPTURE(rep);
      const Solution a_sol = test::host_solve(*bb, grid, cost);
      const Assignment& a = a_sol.assignment;
      CAPTURE(a_sol.note);
      a.validate();  // every task of its grid exactly once, ranks in range
      REQUIRE(a.grid != nullptr);
      CHECK(a.grid->cp_size() == P);
      CHECK(a.grid->total_task_area() == grid->total_task_area());
      const Metrics m = compute_metrics(a);
      CHECK(a_sol.feasible == (excess(m) == 0));
      if (rep < 2) {
        const auto problems = validate_plan(a, build_plan(a, 2));
        CHECK_MESSAGE(problems.empty(), first(problems));
      }
      for (const auto& [name, solver] : members) {
        CAPTURE(name);
        const Metrics o = compute_metrics(test::host_solve(*solver, grid, cost).assignment);
        if (excess(o) == 0) {
          CHECK(excess(m) == 0);  // meets mu where a member does
          CHECK(m.fwd.total_send <= o.fwd.total_send);
        } else if (excess(m) > 0) {
          CHECK(excess(m) <= excess(o));
        }
        ++compared;
      }
    }
  CHECK(compared > 0);
}

TEST_CASE("balanced_bytes gives the same result for 1 and 4 threads") {
  Registry reg;
  reg.scan(CPSCHED_PLUGIN_BUILD_DIR);
  if (find_solver(reg, "balanced_bytes") == nullptr) return;
  Params one, four;
  one.set("threads", std::int64_t{1});
  four.set("threads", std::int64_t{4});
  auto s1 = make(reg, "balanced_bytes", one);
  auto s4 = make(reg, "balanced_bytes", four);
  const AreaCostModel cost;
  std::mt19937_64 rng(4);
  for (int P : {3, 8}) {
    for (int kind = 0; kind < 4; ++kind) {
      const auto grid = random_grid(rng, P, kind);
      const Solution a_sol = test::host_solve(*s1, grid, cost);
      const Assignment& a = a_sol.assignment;
      const Solution b_sol = test::host_solve(*s4, grid, cost);
      const Assignment& b = b_sol.assignment;
      CAPTURE(P);
      CAPTURE(kind);
      CHECK(a.rank == b.rank);
      CHECK(a.grid->sharding().blocks == b.grid->sharding().blocks);
      CHECK(a_sol.note == b_sol.note);
    }
  }
}

TEST_CASE("balanced_bytes splits the shards when a cell alone breaks the balance") {
  Registry reg;
  reg.scan(CPSCHED_PLUGIN_BUILD_DIR);
  if (find_solver(reg, "balanced_bytes") == nullptr) return;
  // One full slice q [32, 64) x k [0, 32) over 2 ranks, head groups not
  // flattened: a single cell carries all the load, twice the mean.
  const std::vector<Slice> one = {{{32, 64}, {0, 32}, MaskType::full}};
  auto p = std::make_shared<const Problem>(Problem::make(RangeMask(64, one), 2, Heads{4, 2, 8, 2}, {false, 1}));
  auto grid = std::make_shared<const TaskGrid>(p);
  REQUIRE(grid->num_tasks() == 1);
  const AreaCostModel cost;
  const Solution a_sol = test::host_solve(*make(reg, "balanced_bytes"), grid, cost);
  const Assignment& a = a_sol.assignment;
  CAPTURE(a_sol.note);
  a.validate();
  CHECK(a_sol.feasible);
  CHECK(a.grid->problem().grid.blocks_per_rank > 1);
  // The finer grid keeps each rank's tokens, and the plan builder follows it.
  CHECK(a.grid->sharding().rank_tokens(0) == grid->sharding().rank_tokens(0));
  CHECK(compute_metrics(a).imbalance <= kMu);
  for (int stages : {1, 2}) {
    const Plan plan = build_plan(a, stages);
    const auto problems = validate_plan(a, plan);
    CHECK_MESSAGE(problems.empty(), first(problems));
    const auto brute = brute_force_plan_coverage(a, plan);
    CHECK_MESSAGE(brute.empty(), first(brute));
  }
  // With no room to split, it says that the target was not met.
  Params coarse;
  coarse.set("max_blocks_per_rank", std::int64_t{1});
  const Solution b_sol = test::host_solve(*make(reg, "balanced_bytes", coarse), grid, cost);
  CHECK_FALSE(b_sol.feasible);
  CHECK(b_sol.note.find("no placement met mu") != std::string::npos);
}

TEST_CASE("balanced_bytes rejects bad parameters, naming them") {
  Registry reg;
  reg.scan(CPSCHED_PLUGIN_BUILD_DIR);
  const PluginInfo* info = find_solver(reg, "balanced_bytes");
  if (info == nullptr) return;
  for (const auto& [name, value] : std::vector<std::pair<std::string, ParamValue>>{
           {"mu", 0.5}, {"fwd_weight", -1.0}, {"effort", std::int64_t{-1}}, {"max_blocks_per_rank", std::int64_t{0}}}) {
    Params given;
    given.set(name, value);
    CAPTURE(name);
    const std::string expected = name + " = ";
    CHECK_THROWS_WITH_AS(reg.make_solver("balanced_bytes", reg.resolve_params(*info, given)),
                         doctest::Contains(expected.c_str()), Error);
  }
}

TEST_CASE("balanced_bytes and ilp on a single rank put everything there") {
  Registry reg;
  reg.scan(CPSCHED_PLUGIN_BUILD_DIR);
  const std::vector<Slice> docs = {{{0, 10}, {0, 10}, MaskType::causal}, {{10, 16}, {10, 16}, MaskType::full}};
  auto p = std::make_shared<const Problem>(Problem::make(RangeMask(16, docs), 1, Heads{8, 4, 16, 2}, {true, 1}));
  auto grid = std::make_shared<const TaskGrid>(p);
  const AreaCostModel cost;
  for (const std::string name : {"balanced_bytes", "ilp"}) {
    if (find_solver(reg, name) == nullptr) continue;
    CAPTURE(name);
    const Solution a_sol = test::host_solve(*make(reg, name), grid, cost);
    const Assignment& a = a_sol.assignment;
    a.validate();
    CHECK(a_sol.feasible);
    CHECK(compute_metrics(a).fwd.total_send == 0);
  }
}
