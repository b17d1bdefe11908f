// The up-front resource estimate for every mask kind (resources.hpp), issue
// 27: index masks were estimated as an 80-byte grid and 0 tasks. Token
// top-k: the estimate counts the grid's pairs and cells exactly and bounds
// the plan's index pools; block selections per KV head: their slices; the
// config refuses a DSA selection that cannot fit before generating it; the
// CLI and the Session refuse at once, naming the key to raise.
#include <doctest/doctest.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>

#include "cpsched/base/error.hpp"
#include "cpsched/problem/resources.hpp"
#include "cpsched/config/config.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/plan/validator.hpp"
#include "cpsched/problem/task_grid.hpp"
#include "cpsched/session/session.hpp"
#include "random_index_masks.hpp"
#include "test_helpers.hpp"

using namespace cpsched;
using test::error_of;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Every task on its q block's host: a valid assignment without a solver.
Assignment on_q_hosts(std::shared_ptr<const TaskGrid> g) {
  Assignment a;
  a.rank.resize(static_cast<std::size_t>(g->num_tasks()));
  for (TaskId t = 0; t < g->num_tasks(); ++t) a.rank[static_cast<std::size_t>(t)] = g->q_host(t);
  a.grid = std::move(g);
  return a;
}

std::int64_t pool_of(const Plan& plan, bool fwd) {
  std::int64_t n = 0;
  for (const RankPlan& r : plan.ranks) n += static_cast<std::int64_t>((fwd ? r.fwd : r.bwd).calc.indices.size());
  return n;
}

std::string dsa_yaml(int cp, int per_rank, int topk) {
  return "problem:\n  cp_size: " + std::to_string(cp) + "\n  seqlen_per_rank: " + std::to_string(per_rank) +
         "\n  heads: {q: 16, kv: 1, dim_qk: 64, dim_v: 32, kv_shared: true}\n"
         "  mask: {kind: dsa, topk: " + std::to_string(topk) + ", sink: 4, local: 8, lengths: [" +
         std::to_string(cp * per_rank / 2) + ", " + std::to_string(cp * per_rank - cp * per_rank / 2) + "]}\n";
}

}  // namespace

TEST_CASE("token top-k: the estimate counts the grid's pairs and cells and bounds the index pools") {
  std::mt19937_64 rng(11);
  for (int it = 0; it < 12; ++it) {
    const int heads = it % 3 == 0 ? 2 : 1;  // per KV head, or shared by both
    const Token S = 40 + static_cast<Token>(rng() % 90);
    const int P = 1 + static_cast<int>(rng() % 5), c = 1 + static_cast<int>(rng() % 3);
    CAPTURE(S);
    CAPTURE(P);
    CAPTURE(c);
    auto mask = test::random_topk(S, heads, 1 + static_cast<int>(rng() % 9), rng);
    if (mask->area() == 0) continue;
    auto p = std::make_shared<const Problem>(Problem::make(mask, P, Heads{4, 2, 8, 2}, GridOptions{true, c}));
    const ResourceEstimate e = estimate_resources(*p);
    auto g = std::make_shared<const TaskGrid>(p);
    CHECK(e.selected_pairs == static_cast<std::int64_t>(mask->area()));
    std::int64_t nonempty = 0;
    for (TaskId t = 0; t < g->num_tasks(); ++t) nonempty += g->area(t) > 0 ? 1 : 0;
    CHECK(e.touches == (g->per_group_cells() ? nonempty : nonempty / g->num_groups()));
    CHECK(e.tasks >= g->task_count());
    CHECK(e.mask_bytes == static_cast<std::int64_t>(mask->indices.size()) * 4);
    CHECK(e.selection_bytes >= e.selected_pairs * 4);
    const Assignment a = on_q_hosts(g);
    for (int stages : {1, 2}) {
      const Plan plan = build_plan(a, stages);
      CHECK(pool_of(plan, true) <= e.index_pool);
      CHECK(pool_of(plan, false) <= e.index_pool);
      CHECK(pool_of(plan, true) >= e.selected_pairs * (g->per_group_cells() ? 1 : g->num_groups()));
    }
    CHECK(e.plan_bytes >= 2 * e.index_pool * 4);
    CHECK(e.total_bytes(false, true) > e.total_bytes(false, false));
  }
}

TEST_CASE("block selections per KV head are estimated from their slices") {
  std::mt19937_64 rng(12);
  auto mask = test::random_block_topk(512, 2, 16, 16, 4, rng);
  auto p = std::make_shared<const Problem>(Problem::make(mask, 4, Heads{8, 2, 16, 2}));
  REQUIRE(p->head_masks.size() == 2);
  const ResourceEstimate e = estimate_resources(*p);
  const TaskGrid g(p);
  CHECK(e.tasks >= g.task_count());
  CHECK(e.tasks > 0);
  CHECK(e.grid_bytes > 80);  // was "grid 80 B (0 cells)": the per-head masks were not seen
  CHECK(e.plan_bytes > 0);
}

TEST_CASE("an index problem over the budget is refused naming the mask and the size to raise the budget to") {
  std::mt19937_64 rng(13);
  auto mask = test::random_topk(2048, 1, 64, rng);
  auto p = std::make_shared<const Problem>(Problem::make(mask, 4, Heads{8, 1, 16, 2}));
  const ResourceEstimate e = estimate_resources(*p);
  const std::string msg = error_of([&] { check_resources(*p, e, MemoryBudget{1 << 20, "test budget"}); });
  CHECK(contains(msg, "problem.mask: the estimated memory"));
  CHECK(contains(msg, "exceeds the memory budget 1.0 MiB (test budget)"));
  CHECK(contains(msg, "raise the budget to at least"));
  CHECK(contains(msg, "memory_budget"));
  CHECK(contains(msg, "index pools 2 x"));
  try {
    check_resources(*p, e, MemoryBudget{1 << 20, "test budget"});
  } catch (const LimitError& le) {
    CHECK(le.key() == "mask");
  }
  // The validator's part is counted only when validating.
  const MemoryBudget just(e.total_bytes(false, false), "exact");
  CHECK_NOTHROW(check_resources(*p, e, just));
  CHECK_THROWS_AS(check_resources(*p, e, just, false, true), LimitError);
  CHECK(validator_chunk_bytes(0) == std::int64_t{256} << 20);
  CHECK(validator_chunk_bytes(std::int64_t{1} << 20) == std::int64_t{4} << 20);
  CHECK(validator_chunk_bytes(std::int64_t{1} << 30) == (std::int64_t{1} << 30) / 10);
}

TEST_CASE("a dsa config that cannot fit is refused before its selection is generated") {
  // S = 16384, topk 2048: 64 MiB of indices, more than 100M selected bytes.
  const std::string yaml = dsa_yaml(8, 2048, 2048) + "memory_budget: 100M\n";
  const std::string msg = error_of([&] { parse_config(yaml, "d.yaml"); });
  CHECK(contains(msg, "d.yaml:5:"));
  CHECK(contains(msg, "problem.mask.topk: this dsa selection"));
  CHECK(contains(msg, "over the memory budget 100.0 MiB (memory_budget in the config)"));
  CHECK(contains(msg, "raise the budget to at least 465M (memory_budget: 465M in the config"));
  // With room, the whole estimate is checked after the selection exists: it fits here.
  CHECK_NOTHROW(parse_config(dsa_yaml(8, 256, 128) + "memory_budget: 256M\n", "d.yaml"));
  // Refused at the mask either way (the selection's bound or the whole estimate).
  const std::string msg2 = error_of([&] { parse_config(dsa_yaml(8, 1024, 512) + "memory_budget: 40M\n", "d.yaml"); });
  CHECK(contains(msg2, "problem.mask"));
  CHECK(contains(msg2, "memory budget 40.0 MiB"));
}

TEST_CASE("topk and nsa_top are clamped to what can be selected") {
  // S = 4096: 200000 keys per query cannot exist; the selection is every row's whole prefix.
  const std::string base = "problem:\n  cp_size: 8\n  seqlen_per_rank: 512\n  heads: {q: 8, kv: 1, dim: 64}\n";
  const Config big = parse_config(base + "  mask: {kind: dsa, topk: 200000, lengths: [4096]}\n", "t.yaml");
  const Problem p = make_problem(big);
  REQUIRE(p.index_mask);
  CHECK(p.index_mask->indices.shape == std::vector<std::int64_t>{4096, 1, 4096});
  const Config same = parse_config(base + "  mask: {kind: dsa, topk: 4096, lengths: [4096]}\n", "t.yaml");
  CHECK(make_problem(same).index_mask->area() == p.index_mask->area());
  // 64 key blocks of 64 tokens: nsa_top 100000 selects them all, as nsa_top 64 does.
  const Config nsa = parse_config(base + "  mask: {kind: nsa, nsa_block: 64, nsa_top: 100000, lengths: [4096]}\n", "t.yaml");
  const Config nsa64 = parse_config(base + "  mask: {kind: nsa, nsa_block: 64, nsa_top: 64, lengths: [4096]}\n", "t.yaml");
  CHECK(make_problem(nsa).mask.area_wide() == make_problem(nsa64).mask.area_wide());
}

TEST_CASE("the Session checks the estimate before building the grid") {
  std::mt19937_64 rng(14);
  auto mask = test::random_topk(2048, 1, 64, rng);
  SessionOptions o;
  o.cp_size = 4;
  o.heads = Heads{8, 1, 16, 2};
  o.solver = "owner";
  o.plugin_paths = {CPSCHED_PLUGIN_BUILD_DIR};
  Session s(o);
  set_memory_budget(1 << 20, "a test's budget");
  const std::string msg = error_of([&] { s.solve(*mask); });
  set_memory_budget(0, "");
  CHECK(contains(msg, "problem.mask: the estimated memory"));
  CHECK(contains(msg, "(a test's budget)"));
  CHECK_NOTHROW(s.solve(*mask));
}
