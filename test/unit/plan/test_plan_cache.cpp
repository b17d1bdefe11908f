// Plan cache: keys tell problems apart, LRU eviction, hit/miss counts,
// collisions never return a wrong entry.
#include <doctest/doctest.h>

#include "cpsched/plan/cache.hpp"

using namespace cpsched;

namespace {

Problem problem(MaskType t = MaskType::causal, int dim = 128) {
  return Problem::make(RangeMask(64, {{{0, 40}, {0, 40}, t}, {{40, 64}, {40, 64}, MaskType::full}}), 4,
                       Heads{8, 2, dim, 2});
}

PlanKey key(const Problem& p, double mu = 1.1, int stages = 1, const std::string& cost = "area") {
  return make_plan_key(p, "binary_greedy", Params({{"mu", mu}, {"threads", std::int64_t{2}}}), cost, Params{},
                       PlanShape::fixed(stages));
}

std::shared_ptr<const SolveResult> entry(double solve_ms) {
  auto c = std::make_shared<SolveResult>();
  c->solve_ms = solve_ms;
  return c;
}

}  // namespace

TEST_CASE("the key covers mask, problem, solver parameters, cost model and stages") {
  const Problem p = problem();
  const PlanKey k = key(p);
  CHECK(key(problem()) == k);
  CHECK_FALSE(key(problem(MaskType::full)) == k);
  CHECK_FALSE(key(problem(MaskType::causal, 64)) == k);
  CHECK_FALSE(key(p, 1.2) == k);
  CHECK_FALSE(key(p, 1.1, 2) == k);
  CHECK_FALSE(key(p, 1.1, 1, "topology") == k);
  CHECK_FALSE(make_plan_key(p, "usp", Params{}, "area", Params{}, PlanShape::fixed(1)) == make_plan_key(p, "owner", Params{}, "area", Params{}, PlanShape::fixed(1)));
  CHECK_FALSE(make_plan_key(p, "usp", Params{}, "area", Params{}, PlanShape::fixed(2)) ==
              make_plan_key(p, "usp", Params{}, "area", Params{}, PlanShape::fixed(2, 0, PlanShape::Cut::ports)));
  Problem q = p;
  q.grid.flatten_head_groups = false;
  CHECK_FALSE(key(q) == k);
  // A parameter name and a string value cannot be confused.
  CHECK_FALSE(make_plan_key(p, "s", Params({{"ab", std::string("c")}}), "area", Params{}, PlanShape::fixed(1)) ==
              make_plan_key(p, "s", Params({{"a", std::string("bc")}}), "area", Params{}, PlanShape::fixed(1)));
}

TEST_CASE("LRU eviction and hit/miss counts") {
  const Problem p = problem();
  const PlanKey a = key(p, 1.0), b = key(p, 1.1), c = key(p, 1.2);
  PlanCache cache(2);
  CHECK(cache.find(a) == nullptr);
  cache.insert(a, entry(1));
  cache.insert(b, entry(2));
  REQUIRE(cache.find(a) != nullptr);  // a is now the most recent
  cache.insert(c, entry(3));          // evicts b
  CHECK(cache.size() == 2);
  CHECK(cache.find(b) == nullptr);
  CHECK(cache.find(a)->solve_ms == 1);
  CHECK(cache.find(c)->solve_ms == 3);
  CHECK(cache.hits() == 3);
  CHECK(cache.misses() == 2);
  cache.insert(c, entry(4));  // replace
  CHECK(cache.size() == 2);
  CHECK(cache.find(c)->solve_ms == 4);
  cache.clear();
  CHECK(cache.size() == 0);
}

TEST_CASE("a colliding hash is a miss, and capacity 0 stores nothing") {
  PlanKey x{{1, 2, 3}, 42}, y{{1, 2, 4}, 42};
  PlanCache cache(4);
  cache.insert(x, entry(1));
  CHECK(cache.find(y) == nullptr);
  CHECK(cache.find(x) != nullptr);
  PlanCache off(0);
  off.insert(x, entry(1));
  CHECK(off.find(x) == nullptr);
  CHECK(off.size() == 0);
}
