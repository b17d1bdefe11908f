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

#include "cpsched/plugin/cost_model.hpp"
#include "plan_fixtures.hpp"
#include "host_solve.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/problem/problem.hpp"
#include "cpsched/problem/task_grid.hpp"
#include "plan_checks.hpp"
#include "random_index_masks.hpp"
#include "test_helpers.hpp"

using namespace cpsched;
using test::random_block_topk;
using test::random_topk;

namespace {

void check_every_solver(const std::shared_ptr<const IndexMask>& mask, int P, Heads heads) {
  auto problem = test::planned(Problem::make(mask, P, heads));
  auto grid = std::make_shared<const TaskGrid>(problem);
  AreaCostModel cost;
  for (const std::string& name : test::solver_names()) {
    Registry& reg = test::build_registry();
    std::unique_ptr<Solver> solver =
        reg.make_solver(name, reg.resolve_params(reg.find(PluginKind::solver, name), test::quick_params(name)));
    const Solution a_sol = test::host_solve(*solver, grid, cost);
    const Assignment& a = a_sol.assignment;
    for (int stages : {1, 2}) {
      CAPTURE(name);
      CAPTURE(stages);
      test::check_valid_plan(a, build_plan(a, stages), true);
      // Relays over nodes of 2 ranks: forwarded rows follow the first phase's in the buffer.
      if (P >= 4) test::check_valid_plan(a, build_plan(a, PlanOptions{stages, 2}), true);
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
  // One stage: the backward's stage cut is the forward's, and so is its pool (shared, not copied).
  CHECK(plan.ranks[1].bwd.calc.indices.shares(calc.indices));
  bool any_index = false;
  for (const auto& args : calc.remote_attn_args)
    for (const AttnArg& x : args) any_index = any_index || x.is_index();
  CHECK(any_index);

  Plan dropped = plan;
  {
    // Pools are immutable and copies share them: a changed pool is a new one.
    std::vector<std::int32_t> pool = dropped.ranks[1].fwd.calc.indices.to_vector();
    *std::find_if(pool.begin(), pool.end(), [](std::int32_t e) { return e >= 0; }) = -1;
    dropped.ranks[1].fwd.calc.indices = IndexPool(std::move(pool));
  }
  CHECK(plan.ranks[1].fwd.calc.indices != dropped.ranks[1].fwd.calc.indices);  // the original is untouched
  CHECK(test::joined(validate_plan(a, dropped)).find("is computed by no arg") != std::string::npos);

  Plan foreign = plan;
  // Another row of the same arg: a pair the mask does not select, or one computed twice.
  const AttnArg& x = foreign.ranks[1].fwd.calc.local_attn_args.empty() ? foreign.ranks[1].fwd.calc.remote_attn_args[0][0]
                                                                        : foreign.ranks[1].fwd.calc.local_attn_args[0];
  std::vector<std::int32_t> pool = foreign.ranks[1].fwd.calc.indices.to_vector();
  std::int32_t& e = pool[static_cast<std::size_t>(x.index_offset)];
  e = static_cast<std::int32_t>(e == x.k.begin ? x.k.end - 1 : x.k.begin);
  foreign.ranks[1].fwd.calc.indices = IndexPool(std::move(pool));
  const std::string found = test::joined(validate_plan(a, foreign));
  CHECK(found.find("computed by no arg") != std::string::npos);
}

TEST_CASE("an index pool is shared by its copies and compares by its entries") {
  const IndexPool a{3, -1, 7};
  const IndexPool b = a;
  CHECK(b.shares(a));
  CHECK(b.data() == a.data());
  const IndexPool c(std::vector<std::int32_t>{3, -1, 7});
  CHECK(!c.shares(a));
  CHECK(c == a);
  CHECK(c != IndexPool{3, -1});
  CHECK(IndexPool{} == IndexPool(std::vector<std::int32_t>{}));
  CHECK(IndexPool{}.empty());
  CHECK(std::vector<std::int32_t>(a.begin(), a.end()) == std::vector<std::int32_t>{3, -1, 7});
  CHECK(a[2] == 7);
  CHECK(a.span().size() == 3);
}

TEST_CASE("the validator checks index pairs in bounded chunks: the same verdicts with 1-pair and whole chunks") {
  // The validator kept 40 bytes per selected pair (2.5 GB on the
  // bundled DSA config). It now checks chunks of query rows; a chunk smaller
  // than a row, chunks of a few rows and one chunk must agree, and a fault
  // is found wherever the chunk boundaries fall.
  std::mt19937_64 rng(21);
  for (int heads : {1, 2}) {
    CAPTURE(heads);
    auto problem = std::make_shared<const Problem>(Problem::make(random_topk(97, heads, 5, rng), 3, Heads{4, 2, 8, 2},
                                                                 GridOptions{true, 2}));
    auto grid = std::make_shared<const TaskGrid>(problem);
    Assignment a;
    a.grid = grid;
    a.rank.resize(static_cast<std::size_t>(grid->num_tasks()));
    // Tasks off their hosts too, so that args read remote buffers.
    for (TaskId t = 0; t < grid->num_tasks(); ++t)
      a.rank[static_cast<std::size_t>(t)] = static_cast<Rank>((grid->q_host(t) + t) % 3);
    for (int stages : {1, 2}) {
      const Plan plan = build_plan(a, stages);
      for (std::size_t chunk : {std::size_t{1}, std::size_t{3}, std::size_t{50}, std::size_t{0}}) {
        CAPTURE(chunk);
        ValidateOptions vo;
        vo.index_chunk_pairs = chunk;
        CHECK(validate_plan(a, plan, vo).empty());
        // A dropped entry and a duplicated one, found in every chunking.
        Plan bad = plan;
        for (RankPlan& r : bad.ranks) {
          std::vector<std::int32_t> pool = r.fwd.calc.indices.to_vector();
          auto it = std::find_if(pool.begin(), pool.end(), [](std::int32_t e) { return e >= 0; });
          if (it != pool.end()) {
            *it = -1;
            r.fwd.calc.indices = IndexPool(std::move(pool));
            break;
          }
        }
        CHECK(test::joined(validate_plan(a, bad, vo)).find("is computed by no arg") != std::string::npos);
        Plan twice = plan;
        bool doubled = false;
        for (RankPlan& r : twice.ranks) {
          std::vector<std::vector<AttnArg>*> lists{&r.fwd.calc.local_attn_args};
          for (auto& l : r.fwd.calc.remote_attn_args) lists.push_back(&l);
          for (auto* args : lists)
            if (!doubled && !args->empty()) {
              args->push_back(args->front());  // the same rows computed again
              doubled = true;
            }
        }
        REQUIRE(doubled);
        CHECK(test::joined(validate_plan(a, twice, vo)).find("computed twice") != std::string::npos);
      }
    }
  }
}
