// Index masks through the whole path: grid, every solver, plan builder and
// validator. Token top-k selections (index args) and block selections (range
// masks per KV head), shared by all heads or per KV head, P in {2, 3, 4},
// stages 1 and 2: the validator and the brute-force coverage find nothing
// (the validator also proves that every received row is read: an index
// mask's plan moves selected KV rows only).
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <random>

#include "cpsched/cost_model.hpp"
#include "cpsched/plan_builder.hpp"
#include "cpsched/problem.hpp"
#include "cpsched/task_grid.hpp"
#include "plan_checks.hpp"
#include "test_helpers.hpp"

using namespace cpsched;

namespace {

// Causal token top-k, -1 padded at random places: row (q, h) selects up to
// k distinct keys <= q.
std::shared_ptr<const IndexMask> random_topk(Token S, int heads, int k, std::mt19937_64& rng) {
  auto data = std::make_shared<std::vector<std::int32_t>>(static_cast<std::size_t>(S * heads * k), -1);
  std::vector<std::int32_t> keys;
  for (Token q = 0; q < S; ++q)
    for (int h = 0; h < heads; ++h) {
      keys.resize(static_cast<std::size_t>(q + 1));
      for (Token j = 0; j <= q; ++j) keys[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
      std::shuffle(keys.begin(), keys.end(), rng);
      const auto n = std::min<std::size_t>(keys.size(), std::uniform_int_distribution<std::size_t>(0, k)(rng));
      std::vector<int> slot(static_cast<std::size_t>(k));
      for (int j = 0; j < k; ++j) slot[static_cast<std::size_t>(j)] = j;
      std::shuffle(slot.begin(), slot.end(), rng);
      for (std::size_t j = 0; j < n; ++j)
        (*data)[static_cast<std::size_t>((q * heads + h) * k + slot[j])] = keys[j];
    }
  auto m = std::make_shared<IndexMask>();
  m->kind = IndexMaskKind::topk;
  m->seqlen = S;
  m->kv_heads = heads;
  m->indices = IndexArray::view(*data, {S, heads, k}, "<random>");
  m->indices.owner = data;
  return m;
}

// Causal block top-k [heads, ceil(S / bq), n]: each query block picks up to
// n distinct key blocks that start at or before its last row.
std::shared_ptr<const IndexMask> random_block_topk(Token S, int heads, int bq, int bk, int n, std::mt19937_64& rng) {
  const Token nq = (S + bq - 1) / bq;
  auto data = std::make_shared<std::vector<std::int32_t>>(static_cast<std::size_t>(heads * nq * n), -1);
  for (int h = 0; h < heads; ++h)
    for (Token qb = 0; qb < nq; ++qb) {
      const Token last = std::min(S, (qb + 1) * bq) - 1;
      std::vector<std::int32_t> blocks;
      for (Token kb = 0; kb * bk <= last; ++kb) blocks.push_back(static_cast<std::int32_t>(kb));
      std::shuffle(blocks.begin(), blocks.end(), rng);
      const auto take = std::min<std::size_t>(blocks.size(), std::uniform_int_distribution<std::size_t>(1, n)(rng));
      for (std::size_t j = 0; j < take; ++j) (*data)[static_cast<std::size_t>((h * nq + qb) * n) + j] = blocks[j];
    }
  auto m = std::make_shared<IndexMask>();
  m->kind = IndexMaskKind::block_topk;
  m->seqlen = S;
  m->kv_heads = heads;
  m->block_q = bq;
  m->block_k = bk;
  m->indices = IndexArray::view(*data, {heads, nq, n}, "<random>");
  m->indices.owner = data;
  return m;
}

std::vector<std::string> solver_names() {
  std::vector<std::string> v;
  for (const PluginInfo& p : test::build_registry().plugins())
    if (p.kind == PluginKind::solver) v.push_back(p.name);
  std::sort(v.begin(), v.end());
  return v;
}

void check_every_solver(const std::shared_ptr<const IndexMask>& mask, int P, Heads heads) {
  auto problem = std::make_shared<const Problem>(Problem::make(mask, P, heads));
  auto grid = std::make_shared<const TaskGrid>(problem);
  AreaCostModel cost;
  for (const std::string& name : solver_names()) {
    Registry& reg = test::build_registry();
    std::unique_ptr<Solver> solver = reg.make_solver(name, reg.resolve_params(reg.find(PluginKind::solver, name), {}));
    const Assignment a = solver->solve(SolveInput{grid, &cost});
    for (int stages : {1, 2}) {
      CAPTURE(name);
      CAPTURE(stages);
      test::check_valid_plan(a, build_plan(a, stages), true);
    }
  }
}

}  // namespace

TEST_CASE("token top-k masks plan and validate with every solver") {
  std::mt19937_64 rng(7);
  for (int P : {2, 3, 4}) {
    CAPTURE(P);
    check_every_solver(random_topk(61, 1, 6, rng), P, Heads{4, 2, 8, 2});  // shared by the two KV heads
    check_every_solver(random_topk(53, 2, 5, rng), P, Heads{4, 2, 8, 2});  // per KV head
  }
}

TEST_CASE("block top-k masks plan and validate with every solver") {
  std::mt19937_64 rng(8);
  for (int P : {2, 3, 4}) {
    CAPTURE(P);
    check_every_solver(random_block_topk(64, 1, 1, 8, 3, rng), P, Heads{4, 2, 8, 2});
    check_every_solver(random_block_topk(70, 2, 4, 8, 2, rng), P, Heads{4, 2, 8, 2});
  }
}

TEST_CASE("a per-head selection needs flattened groups and matching heads") {
  std::mt19937_64 rng(9);
  const auto m = random_topk(16, 2, 3, rng);
  CHECK(test::error_of([&] { (void)Problem::make(m, 2, Heads{4, 4, 8, 2}); }).find("selects for 2 KV heads but heads.kv = 4") !=
        std::string::npos);
  GridOptions g;
  g.flatten_head_groups = false;
  CHECK(test::error_of([&] { (void)Problem::make(m, 2, Heads{4, 2, 8, 2}, g); }).find("needs flattened head groups") !=
        std::string::npos);
}

TEST_CASE("the validator proves index args: a dropped or a foreign entry is found") {
  std::mt19937_64 rng(10);
  auto problem = std::make_shared<const Problem>(Problem::make(random_topk(40, 1, 4, rng), 2, Heads{4, 2, 8, 2}));
  auto grid = std::make_shared<const TaskGrid>(problem);
  Assignment a;
  a.grid = grid;
  a.rank.resize(static_cast<std::size_t>(grid->num_tasks()));
  for (TaskId t = 0; t < grid->num_tasks(); ++t) a.rank[static_cast<std::size_t>(t)] = grid->q_host(t);
  const Plan plan = build_plan(a, 1);
  REQUIRE(validate_plan(a, plan).empty());
  // The plan of rank 1 (which needs rank 0's keys) has index args.
  const CalcMeta& calc = plan.ranks[1].fwd.calc;
  REQUIRE(!calc.indices.empty());
  bool any_index = false;
  for (const auto& args : calc.remote_attn_args)
    for (const AttnArg& x : args) any_index = any_index || x.is_index();
  CHECK(any_index);

  auto first_entry = [](const Plan& p) -> std::int32_t& {
    auto& pool = const_cast<Plan&>(p).ranks[1].fwd.calc.indices;
    return *std::find_if(pool.begin(), pool.end(), [](std::int32_t e) { return e >= 0; });
  };
  Plan dropped = plan;
  first_entry(dropped) = -1;
  CHECK(test::joined(validate_plan(a, dropped)).find("is computed by no arg") != std::string::npos);

  Plan foreign = plan;
  // Another row of the same arg: a pair the mask does not select, or one computed twice.
  const AttnArg& x = foreign.ranks[1].fwd.calc.local_attn_args.empty() ? foreign.ranks[1].fwd.calc.remote_attn_args[0][0]
                                                                        : foreign.ranks[1].fwd.calc.local_attn_args[0];
  std::int32_t& e = foreign.ranks[1].fwd.calc.indices[static_cast<std::size_t>(x.index_offset)];
  e = static_cast<std::int32_t>(e == x.k.begin ? x.k.end - 1 : x.k.begin);
  const std::string found = test::joined(validate_plan(a, foreign));
  CHECK(found.find("computed by no arg") != std::string::npos);
}
