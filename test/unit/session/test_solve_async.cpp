// Planning ahead (Session::solve_async): the result is the one solve() gives,
// lands in the cache, identical masks in flight share one solve, the queue
// is bounded, errors reach the caller, and closing the session never hangs.
#include <doctest/doctest.h>

#include <chrono>
#include <vector>

#include "cpsched/base/error.hpp"
#include "cpsched/io/plan_json.hpp"
#include "cpsched/session/session.hpp"
#include "test_helpers.hpp"

using namespace cpsched;

namespace {

std::shared_ptr<Registry> registry() { return test::new_build_registry(); }

SessionOptions options(std::size_t queue = 4) {
  SessionOptions o;
  o.cp_size = 8;
  o.seqlen = 8 * 2048;
  o.heads = {16, 4, 64, 2};
  o.solver = "balanced_bytes";
  o.cost_model = "time";
  o.plan.stages = PlanShape::kAutoStages;
  o.ahead_queue = queue;
  return o;
}

// Document masks that differ by their cut points: distinct plans.
RangeMask docs(Token cut) {
  const Token S = 8 * 2048;
  return RangeMask(S, {Slice{{0, cut}, {0, cut}, MaskType::causal}, Slice{{cut, S}, {cut, S}, MaskType::causal}});
}

std::string json_of(const SolveResult& r) {
  PlanExport e;
  e.assignment = r.assignment.get();
  e.metrics = &r.metrics;
  e.plan = r.plan.get();
  return plan_json(e, -1);
}

bool ready(const std::shared_future<std::shared_ptr<const SolveResult>>& f) {
  return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

}  // namespace

TEST_CASE("solve_async gives solve()'s plan, and solve() of that mask afterwards is a cache hit") {
  auto reg = registry();
  Session ahead(options(), reg), now(options(), reg);
  auto f = ahead.solve_async(docs(5000));
  const SolveResult& want = now.solve(docs(5000));
  const std::shared_ptr<const SolveResult> got = f.get();
  REQUIRE(got);
  CHECK(json_of(*got) == json_of(want));
  const SolveResult& again = ahead.solve(docs(5000));
  CHECK(ahead.last_was_cached());
  CHECK(&again == got.get());
  // A mask already cached is ready at once.
  CHECK(ready(ahead.solve_async(docs(5000))));
}

TEST_CASE("identical masks in flight are solved once; solve() of one in flight waits for it") {
  Session s(options(), registry());
  std::vector<std::shared_future<std::shared_ptr<const SolveResult>>> fs;
  for (Token cut : {3000, 7000, 3000, 3000}) fs.push_back(s.solve_async(docs(cut)));
  const SolveResult& waited = s.solve(docs(7000));  // in flight or done: never solved twice
  CHECK(s.last_was_cached());
  CHECK(&waited == fs[1].get().get());
  CHECK(fs[0].get() == fs[2].get());
  CHECK(fs[0].get() == fs[3].get());
  CHECK(fs[0].get() != fs[1].get());
  CHECK(s.cache().size() == 2);
}

TEST_CASE("a queue of one still plans every mask, in order, each as solve() would") {
  auto reg = registry();
  Session s(options(1), reg), ref(options(), reg);
  std::vector<Token> cuts{1000, 2000, 4000, 6000, 9000};
  std::vector<std::shared_future<std::shared_ptr<const SolveResult>>> fs;
  for (Token c : cuts) fs.push_back(s.solve_async(docs(c)));  // waits for a slot when the queue is full
  for (std::size_t i = 0; i < cuts.size(); ++i) {
    CAPTURE(cuts[i]);
    CHECK(json_of(*fs[i].get()) == json_of(ref.solve(docs(cuts[i]))));
  }
}

TEST_CASE("solve_async: a bad mask throws at the call; ahead_queue 0 is refused; closing never hangs") {
  Session s(options(), registry());
  CHECK_THROWS_AS(s.solve_async({{0, 10}}, {{0, 10}, {10, 20}}, {MaskType::full}), Error);
  CHECK_THROWS_AS(s.solve_async(RangeMask(8 * 2048, {Slice{{0, 20000}, {0, 10}, MaskType::full}})), Error);
  SessionOptions zero = options();
  zero.ahead_queue = 0;
  CHECK_THROWS_WITH_AS(Session(zero, registry()), "session: ahead_queue must be at least 1, got 0", Error);

  std::vector<std::shared_future<std::shared_ptr<const SolveResult>>> fs;
  {
    Session closing(options(8), registry());
    for (Token c : {1500, 2500, 3500, 4500, 5500}) fs.push_back(closing.solve_async(docs(c)));
  }  // finishes the solve in progress, fails the waiting ones
  int solved = 0, failed = 0;
  for (auto& f : fs) {
    REQUIRE(ready(f));
    try {
      if (f.get()) ++solved;
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("closed before this mask") != std::string::npos);
      ++failed;
    }
  }
  CHECK(solved + failed == 5);  // how many were solved before the close depends on timing
}
