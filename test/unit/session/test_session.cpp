// The library facade (cpsched.hpp): solve with the seed's three lists, metas
// per rank, the plan cache in front, built from code or from a config.
#include <doctest/doctest.h>

#include <filesystem>

#include "cpsched/plan/builder.hpp"
#include "cpsched/session/session.hpp"
#include "test_helpers.hpp"
#include "cpsched/base/error.hpp"

using namespace cpsched;

namespace {

std::shared_ptr<Registry> registry() { return test::new_build_registry(); }

SessionOptions options() {
  SessionOptions o;
  o.cp_size = 4;
  o.seqlen = 103;  // uneven shards
  o.heads = {8, 2, 16, 2};
  o.solver = "owner";
  o.plan.stages = 2;
  o.cache_size = 2;
  o.validate = true;
  return o;
}

// Two causal documents and a full one, as the seed's lists.
const std::vector<Range> kQ{{0, 50}, {50, 90}, {90, 103}};
const std::vector<Range> kK{{0, 50}, {50, 90}, {90, 103}};
const std::vector<MaskType> kT{MaskType::causal, MaskType::causal, MaskType::full};

}  // namespace

TEST_CASE("solve, then per-rank metas, metrics and plan; a repeated mask hits the cache") {
  Session s(options(), registry());
  CHECK_THROWS_WITH_AS(s.plan(), doctest::Contains("nothing solved"), Error);
  const SolveResult& r = s.solve(kQ, kK, kT);
  CHECK_FALSE(s.last_was_cached());
  CHECK(s.problem().seqlen() == 103);
  CHECK(s.plan().num_stages == 2);
  CHECK(s.plan().ranks.size() == 4);
  for (Rank rank = 0; rank < 4; ++rank) {
    CHECK(&s.calc_meta(rank) == &s.plan().ranks[static_cast<std::size_t>(rank)].fwd.calc);
    CHECK(&s.comm_meta(rank, Pass::bwd) == &s.plan().ranks[static_cast<std::size_t>(rank)].bwd.comm);
  }
  CHECK_THROWS_AS(s.calc_meta(4), Error);
  CHECK(s.metrics().fwd.total_send == compute_metrics(s.assignment()).fwd.total_send);
  CHECK(s.validate().empty());
  CHECK(r.solve_ms >= 0);

  s.solve(kQ, kK, kT);
  CHECK(s.last_was_cached());
  CHECK(s.cache().hits() == 1);
  CHECK(s.cache().misses() == 1);

  // Another mask misses; with capacity 2 the first stays until a third comes.
  s.solve({{0, 103}}, {{0, 103}}, {MaskType::causal});
  CHECK_FALSE(s.last_was_cached());
  s.solve(kQ, kK, kT);
  CHECK(s.last_was_cached());
  CHECK(s.cache().size() == 2);
}

TEST_CASE("bad inputs are errors that say what is wrong") {
  auto reg = registry();
  SessionOptions o = options();
  o.solver = "no_such_solver";
  CHECK_THROWS_WITH_AS(Session(o, reg), doctest::Contains("no_such_solver"), Error);
  o = options();
  o.solver_params.set("nonsense", 1.0);
  CHECK_THROWS_WITH_AS(Session(o, reg), doctest::Contains("nonsense"), Error);
  o = options();
  o.plugin_paths = {"/nonexistent-cpsched-dir"};
  CHECK_THROWS_WITH_AS(Session(o, reg), doctest::Contains("session: plugin_paths[0]: /nonexistent-cpsched-dir: no such folder"),
                       Error);
  o = options();
  o.plan.stages = -1;
  CHECK_THROWS_WITH_AS(Session(o, reg), doctest::Contains("stages"), Error);
  Session s(options(), reg);
  CHECK_THROWS_WITH_AS(s.solve(kQ, kK, {MaskType::full}), doctest::Contains("3 q ranges"), Error);
  CHECK_THROWS_WITH_AS(s.solve({{0, 60}, {50, 103}}, {{0, 60}, {0, 103}}, {MaskType::full, MaskType::full}),
                       doctest::Contains("overlap"), Error);
  CHECK_THROWS_WITH_AS(s.solve_config_mask(), doctest::Contains("Config"), Error);
  // An empty workload is an error here as in a config (it gave a 0-task result; docs/hardening.md).
  CHECK_THROWS_WITH_AS(s.solve({}, {}, {}), doctest::Contains("no slice"), Error);
  // A top-k selection must have the session's S, and at least one token per rank.
  std::vector<std::int32_t> rows(2048, -1);
  for (int i = 0; i < 2048; ++i) rows[static_cast<std::size_t>(i)] = i;  // each query selects itself
  CHECK_THROWS_WITH_AS(s.solve_topk(rows, 2048, 1), doctest::Contains("S = 2048 tokens but the session's seqlen is 103"),
                       Error);
  SessionOptions any = options();
  any.seqlen = 0;
  Session free_s(any, reg);
  CHECK_THROWS_WITH_AS(free_s.solve_topk({rows.data(), 3}, 3, 1),
                       doctest::Contains("S = 3 tokens, fewer than the 4 blocks of the grid"), Error);
  CHECK(free_s.solve_topk(rows, 2048, 1).plan->ranks.size() == 4);
}

TEST_CASE("from a config: its problem, solver and plan options; SVG and JSON of the result") {
  const Config cfg = parse_config(R"(
problem:
  cp_size: 3
  seqlen_per_rank: 40
  heads: {q: 4, kv: 2, dim: 8, dtype: bf16}
  mask: {kind: causal_document, lengths: [70, 30, 20]}
solver: {name: owner}
cost_model: {name: area}
plan: {stages: 2, cache_size: 4}
)",
                                  "test-config");
  Session s(cfg, registry());
  CHECK(s.options().plan.stages == 2);
  CHECK(s.options().cache_size == 4);
  s.solve_config_mask();
  CHECK(s.problem().seqlen() == 120);
  CHECK(s.problem().cp_size() == 3);
  CHECK(s.validate().empty());
  const auto file = std::filesystem::temp_directory_path() / "cpsched_test_session.svg";
  s.write_svg(file);
  CHECK(std::filesystem::file_size(file) > 1000);
  std::filesystem::remove(file);
  CHECK(s.plan_json().find("\"format\":\"cpsched-plan/1\"") != std::string::npos);
}
