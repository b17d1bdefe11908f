// Plan builder: valid, token-granular plans for random masks and placements,
// checked by the validator and entry by entry.
#include <doctest/doctest.h>

#include <random>
#include <tuple>

#include "brute_force.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/plan/validator.hpp"
#include "plan_fixtures.hpp"

using namespace cpsched;
using cpsched::test::make_grid;
using cpsched::test::owner_assignment;
using cpsched::test::random_assignment;

namespace {

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

void check_valid(const Assignment& a, int stages) {
  const Plan plan = build_plan(a, stages);
  const auto problems = validate_plan(a, plan);
  CHECK_MESSAGE(problems.empty(), joined(problems));
  const auto brute = brute_force_plan_coverage(a, plan);
  CHECK_MESSAGE(brute.empty(), joined(brute));
}

}  // namespace

TEST_CASE("two ranks, full mask, owner placement: hand-checked plan") {
  // S = 4, P = 2, hkv = 2 flattened: rank 0 computes cell (0, 1) of both
  // groups, so it receives k tokens [2, 4) of rank 1 once per group.
  auto g = make_grid(RangeMask(4, {{{0, 4}, {0, 4}, MaskType::full}}), 2);
  const Assignment a = owner_assignment(g);
  const Plan plan = build_plan(a, 1);
  REQUIRE(plan.ranks.size() == 2);
  const PassPlan& r0 = plan.ranks[0].fwd;
  CHECK(r0.calc.local_attn_args.size() == 2);  // cell (0, 0), groups 0 and 1
  CHECK(r0.calc.local_attn_args[0] == AttnArg{{0, 2}, {0, 2}, MaskType::full, BufferId::local, BufferId::local, 0});
  REQUIRE(r0.calc.remote_attn_args.size() == 1);
  REQUIRE(r0.calc.remote_attn_args[0].size() == 2);
  CHECK(r0.calc.remote_attn_args[0][0] ==
        AttnArg{{0, 2}, {0, 2}, MaskType::full, BufferId::local, BufferId::remote, 0});
  CHECK(r0.calc.remote_attn_args[0][1] ==
        AttnArg{{0, 2}, {2, 4}, MaskType::full, BufferId::local, BufferId::remote, 1});
  const StageComm& c0 = r0.comm.stages.at(0);
  CHECK(c0.num_remote_kv_tokens == 4);
  CHECK(c0.num_remote_qo_tokens == 0);
  CHECK(c0.kv.output_split_sizes == std::vector<Token>{2, 2});
  CHECK(c0.kv.src_index == std::vector<Rank>{1, 1});
  CHECK(c0.kv.output_groups == std::vector<int>{0, 1});
  // Rank 1 sends its whole shard (local [0, 2)) for both groups to rank 0.
  const StageComm& c1 = plan.ranks[1].fwd.comm.stages.at(0);
  CHECK(c1.kv.input_ranges == std::vector<Range>{{0, 2}, {0, 2}});
  CHECK(c1.kv.input_groups == std::vector<int>{0, 1});
  CHECK(c1.kv.dst_indices == std::vector<std::vector<Rank>>{{0}, {0}});
  CHECK(c0.kv_reduce_after == 1);
  CHECK(c0.qo_reduce_after == 0);
  CHECK(plan.ranks[0].bwd.calc.local_attn_args == r0.calc.local_attn_args);
  CHECK(validate_plan(a, plan).empty());
}

TEST_CASE("a causal cell computed remotely is cut exactly and only needed rows travel") {
  // One causal slice over S = 12, P = 3 (shards of 4). Put every task of the
  // off-diagonal cell (q block 2, kv block 1) on rank 0: rank 0 receives q rows
  // [8, 12) from rank 2 and k cols [4, 8) from rank 1.
  auto g = make_grid(RangeMask(12, {{{0, 12}, {0, 12}, MaskType::causal}}), 3, {2, 1, 8, 2});
  Assignment a = owner_assignment(g);
  for (TaskId t = 0; t < g->num_tasks(); ++t)
    if (g->cell_of(t).qblock == 2 && g->cell_of(t).kblock == 1) a.rank[static_cast<std::size_t>(t)] = 0;
  const Plan plan = build_plan(a, 1);
  const PassPlan& r0 = plan.ranks[0].fwd;
  REQUIRE(r0.calc.remote_attn_args.at(0).size() == 1);
  CHECK(r0.calc.remote_attn_args[0][0] ==
        AttnArg{{0, 4}, {0, 4}, MaskType::full, BufferId::remote, BufferId::remote, 0});
  CHECK(r0.comm.stages[0].num_remote_qo_tokens == 4);
  CHECK(r0.comm.stages[0].num_remote_kv_tokens == 4);
  CHECK(validate_plan(a, plan).empty());
}

TEST_CASE("a block needed by several ranks goes out as one split with several destinations") {
  // Full mask, P = 3, one group: put cell (0, 0) on ranks... cells of q block 0
  // on ranks 1 and 2 both need q rows [0, 4) of rank 0.
  auto g = make_grid(RangeMask(12, {{{0, 12}, {0, 12}, MaskType::full}}), 3, {2, 1, 8, 2});
  Assignment a = owner_assignment(g);
  for (TaskId t = 0; t < g->num_tasks(); ++t) {
    const Cell& c = g->cell_of(t);
    if (c.qblock == 0 && c.kblock == 1) a.rank[static_cast<std::size_t>(t)] = 1;
    if (c.qblock == 0 && c.kblock == 2) a.rank[static_cast<std::size_t>(t)] = 2;
  }
  const Plan plan = build_plan(a, 1);
  const GroupCollectiveArg& qo = plan.ranks[0].fwd.comm.stages[0].qo;
  REQUIRE(qo.dst_indices.size() == 1);
  CHECK(qo.dst_indices[0] == std::vector<Rank>{1, 2});
  CHECK(qo.input_ranges[0] == Range{0, 4});
  CHECK(validate_plan(a, plan).empty());
}

TEST_CASE("stages: every stage has its own comm, tasks wait only for data of their stage or earlier") {
  std::mt19937_64 rng(5);
  auto g = make_grid(test::random_document_mask(61, rng), 4, {4, 2, 8, 2});
  const Assignment a = random_assignment(g, rng);
  const Plan p1 = build_plan(a, 1), p3 = build_plan(a, 3);
  CHECK(p3.num_stages == 3);
  for (std::size_t r = 0; r < 4; ++r) {
    CHECK(p3.ranks[r].fwd.comm.stages.size() == 3);
    CHECK(p3.ranks[r].fwd.calc.remote_attn_args.size() == 3);
    // Same data in total, whatever the stage cut.
    Token q1 = 0, q3 = 0;
    for (const auto& s : p1.ranks[r].fwd.comm.stages) q1 += s.num_remote_qo_tokens + s.num_remote_kv_tokens;
    for (const auto& s : p3.ranks[r].fwd.comm.stages) q3 += s.num_remote_qo_tokens + s.num_remote_kv_tokens;
    CHECK(q1 == q3);
    CHECK(p1.ranks[r].fwd.calc.local_attn_args == p3.ranks[r].fwd.calc.local_attn_args);
  }
  CHECK(validate_plan(a, p3).empty());
}

TEST_CASE("random masks and placements, uneven shards: valid plans, exactly-once coverage") {
  std::mt19937_64 rng(1234);
  for (int it = 0; it < 40; ++it) {
    const int P = 2 + static_cast<int>(rng() % 4);
    const Token S = P * 5 + static_cast<Token>(rng() % 17);
    const bool flatten = rng() % 3 != 0;
    const int bpr = 1 + static_cast<int>(rng() % 2);
    auto g = make_grid(test::random_document_mask(S, rng), P, {4, 2, 8, 2}, {flatten, bpr});
    const Assignment a = it % 5 == 0 ? owner_assignment(g) : random_assignment(g, rng);
    const int stages = 1 + static_cast<int>(rng() % 4);
    CAPTURE(it);
    CAPTURE(P);
    CAPTURE(S);
    CAPTURE(stages);
    check_valid(a, stages);
  }
}

// The transfers are collected by several threads on large grids (one per
// million tasks); each takes a run of receivers and the runs are joined in
// order, so the plans must not depend on the count.
TEST_CASE("the plan builder's plans are the same whatever the threads that collect its transfers") {
  std::mt19937_64 rng(77);
  for (int it = 0; it < 12; ++it) {
    const int P = 3 + static_cast<int>(rng() % 9);
    const Token S = P * 7 + static_cast<Token>(rng() % 23);
    auto g = make_grid(test::random_document_mask(S, rng), P, {4, 2, 8, 2}, {rng() % 2 == 0, 1 + static_cast<int>(rng() % 2)});
    const Assignment a = random_assignment(g, rng);
    PlanOptions o{1 + static_cast<int>(rng() % 3), it % 3 == 0 && P >= 4 ? 2 : 0};
    CAPTURE(it);
    CAPTURE(P);
    CAPTURE(o.stages);
    CAPTURE(o.relay_node_size);
    const PlanBuilder one(a, 1);
    const Plan ref = one.build(o);
    for (const int threads : {2, 3, P, 2 * P}) {
      CAPTURE(threads);
      const PlanBuilder many(a, threads);
      const Plan p = many.build(o);
      CHECK(p.ranks == ref.ranks);
      const auto key = [](const std::vector<Transfer>& v) {
        std::vector<std::tuple<RowKind, std::int32_t, std::int32_t, Rank, Rank, Token>> out;
        for (const Transfer& t : v) out.emplace_back(t.kind, t.block, t.group, t.host, t.dst, t.tokens);
        return out;
      };
      CHECK(key(many.transfers()) == key(one.transfers()));
    }
  }
  auto g = make_grid(test::random_document_mask(20, rng), 2);
  CHECK_THROWS_WITH_AS(PlanBuilder(owner_assignment(g), -1), "plan: threads must be 0 (by the grid's size) or more, got -1",
                       Error);
}

TEST_CASE("the CommMeta moves exactly the token-granular transfers of the metrics") {
  std::mt19937_64 rng(99);
  auto g = make_grid(test::random_document_mask(40, rng), 4);
  const Assignment a = random_assignment(g, rng);
  const Plan plan = build_plan(a, 2);
  const Metrics m = compute_metrics(a);
  Token qo = 0, kv = 0;
  for (const RankPlan& rp : plan.ranks)
    for (const StageComm& s : rp.bwd.comm.stages) {
      qo += s.num_remote_qo_tokens;
      kv += s.num_remote_kv_tokens;
    }
  CHECK(qo == m.remote_qo_tokens);
  CHECK(kv == m.remote_kv_tokens);
}

TEST_CASE("build_plan rejects stages < 1 and invalid assignments") {
  auto g = make_grid(RangeMask(4, {{{0, 4}, {0, 4}, MaskType::full}}), 2);
  Assignment a = owner_assignment(g);
  CHECK_THROWS_WITH_AS(build_plan(a, 0), doctest::Contains("stages"), Error);
  a.rank[0] = 7;
  CHECK_THROWS_AS(build_plan(a, 1), Error);
}

TEST_CASE("stage cut: stages double, stages 1..s receive at least (2^s - 1) / (2^N - 1) of a rank's bytes, in both passes") {
  std::mt19937_64 rng(8);
  auto g = make_grid(test::random_document_mask(90, rng), 5, {4, 2, 8, 2});
  const Assignment a = random_assignment(g, rng);
  const int N = 3;
  const Plan plan = build_plan(a, N);
  for (bool fwd : {true, false}) {
    const TransferBytes tb = fwd ? fwd_bytes_per_token(g->problem()) : bwd_bytes_per_token(g->problem());
    for (const RankPlan& rp : plan.ranks) {
      const CommMeta& c = fwd ? rp.fwd.comm : rp.bwd.comm;
      std::vector<Bytes> per(N, 0);
      for (int s = 0; s < N; ++s)
        per[static_cast<std::size_t>(s)] = c.stages[static_cast<std::size_t>(s)].num_remote_qo_tokens * tb.qo_out +
                                           c.stages[static_cast<std::size_t>(s)].num_remote_kv_tokens * tb.kv_out;
      const Bytes total = per[0] + per[1] + per[2];
      Bytes cum = 0;
      for (int s = 0; s < N; ++s) {
        cum += per[static_cast<std::size_t>(s)];
        CHECK(cum * ((Bytes{1} << N) - 1) >= total * ((Bytes{1} << (s + 1)) - 1));
      }
    }
  }
}

TEST_CASE("degenerate sizes: one rank, ranks without tokens") {
  std::mt19937_64 rng(21);
  for (auto [S, P] : {std::pair<Token, int>{7, 1}, {3, 5}, {5, 5}}) {
    auto g = make_grid(test::random_document_mask(S, rng), P, {4, 2, 8, 2}, {true, 2});
    const Assignment a = random_assignment(g, rng);
    CAPTURE(S);
    CAPTURE(P);
    for (int stages : {1, 3}) check_valid(a, stages);
  }
}
