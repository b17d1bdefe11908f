// Per-rank ingestion of a token top-k mask: each rank summarises its own
// index rows, the P summaries are gathered (here: a loop), and each rank
// plans from them and its own rows alone. Its plan must be exactly its part
// of the plan made from the whole [S, H, k] tensor with owner's placement.
#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cpsched/base/error.hpp"
#include "cpsched/plan/deferred_index.hpp"
#include "cpsched/session/session.hpp"
#include "random_index_masks.hpp"
#include "test_helpers.hpp"

using namespace cpsched;

namespace {

IndexMask dsa(Token S, int kv_heads, int pack) { return test::small_dsa(S, kv_heads, pack, 48, 4, 16); }

std::span<const std::int32_t> rows_of(const IndexMask& m, Range r) {
  const std::int64_t per = m.indices.shape[1] * m.indices.shape[2];
  return {m.indices.data + r.begin * per, static_cast<std::size_t>(r.size() * per)};
}

SessionOptions options(int P, int bpr, int stages, const std::string& solver, Rank rank) {
  SessionOptions o;
  o.cp_size = P;
  o.heads = Heads{4, 2, 8, 2};
  o.grid.blocks_per_rank = bpr;
  o.solver = solver;
  o.cost_model = "time";
  o.plan.stages = stages;
  o.rank = rank;
  return o;
}

// P ranks of `mask`, each with its session (of `solver`, one block per rank,
// one stage) and its summary.
struct RankSessions {
  Sharding shards;
  std::vector<Session> ranks;
  std::vector<std::vector<IndexCell>> summaries;
  RankSessions(const IndexMask& mask, int P, const std::string& solver)
      : shards(Sharding::sequential(mask.seqlen, P, 1)) {
    for (Rank r = 0; r < P; ++r) {
      ranks.emplace_back(options(P, 1, 1, solver, r));
      summaries.push_back(ranks.back().summarize_topk(rows_of(mask, shards.blocks[static_cast<std::size_t>(r)]),
                                                      mask.seqlen, mask.kv_heads));
    }
  }
};

// The plan of the whole tensor with owner's placement, every rank's.
Session whole_owner(const IndexMask& mask, int P) {
  Session whole(options(P, 1, 1, "owner", -1));
  whole.solve_topk({mask.indices.data, static_cast<std::size_t>(mask.indices.size())}, mask.seqlen, mask.kv_heads);
  return whole;
}

}  // namespace

TEST_CASE("a rank's plan from the gathered summaries and its own rows is its part of the whole tensor's plan") {
  int checked = 0;
  for (int P : {2, 3, 4, 8}) {
    const Token S = Token{64} * P + 5;  // uneven shards
    for (int H : {1, 2}) {
      const IndexMask mask = dsa(S, H, P + H);
      const std::span<const std::int32_t> all(mask.indices.data, static_cast<std::size_t>(mask.indices.size()));
      for (int bpr : {1, 2}) {
        for (int stages : {1, PlanShape::kAutoStages}) {
          CAPTURE(P);
          CAPTURE(H);
          CAPTURE(bpr);
          CAPTURE(stages);
          Session whole(options(P, bpr, stages, "owner", -1));
          whole.solve_topk(all, S, H);
          const Sharding shards = Sharding::sequential(S, P, 1);
          std::vector<Session> ranks;
          std::vector<std::vector<IndexCell>> summaries;
          for (Rank r = 0; r < P; ++r) {
            // The session's solver is not what plans from summaries: owner's placement is.
            ranks.emplace_back(options(P, bpr, stages, "balanced_bytes", r));
            summaries.push_back(ranks.back().summarize_topk(rows_of(mask, shards.blocks[static_cast<std::size_t>(r)]), S, H));
          }
          for (Rank r = 0; r < P; ++r) {
            CAPTURE(r);
            Session& mine = ranks[static_cast<std::size_t>(r)];
            mine.solve_topk_summaries(summaries, rows_of(mask, shards.blocks[static_cast<std::size_t>(r)]), S, H);
            CHECK(mine.plan().only_rank == r);
            CHECK(mine.plan().num_stages == whole.plan().num_stages);
            CHECK(mine.assignment().rank == whole.assignment().rank);
            for (Pass pass : {Pass::fwd, Pass::bwd}) {
              CHECK(mine.calc_meta(r, pass) == whole.calc_meta(r, pass));
              CHECK(mine.comm_meta(r, pass) == whole.comm_meta(r, pass));
            }
            CHECK(mine.metrics().fwd.total_send == whole.metrics().fwd.total_send);
            // Validated as its rank's part, among its peers' comm.
            CHECK(mine.validate() == std::vector<std::string>{});
            ++checked;
          }
        }
      }
    }
  }
  CHECK(checked == 2 * 2 * 2 * (2 + 3 + 4 + 8));
}

TEST_CASE("a rank's pool large enough for several writer threads is its part of the whole tensor's plan") {
  // Pools of over 2M entries are written by two threads or more (where the
  // hardware has them); the args and the pool do not depend on it.
  const int P = 2;
  const Token S = 8192;
  const IndexMask mask = test::small_dsa(S, 1, 1, 1024, 16, 128);
  const Session whole = whole_owner(mask, P);
  RankSessions rs(mask, P, "owner");
  for (Rank r = 0; r < P; ++r) {
    CAPTURE(r);
    Session& mine = rs.ranks[static_cast<std::size_t>(r)];
    mine.solve_topk_summaries(rs.summaries, rows_of(mask, rs.shards.blocks[static_cast<std::size_t>(r)]), S, 1);
    CHECK(mine.calc_meta(r, Pass::fwd) == whole.calc_meta(r, Pass::fwd));
    CHECK(mine.calc_meta(r, Pass::bwd) == whole.calc_meta(r, Pass::bwd));
  }
  CHECK(rs.ranks[1].calc_meta(1).indices.size() > (std::size_t{2} << 20));
}

TEST_CASE("a rank's repeated plans reuse the session's buffers and stay the whole tensor's part") {
  // The third call takes the buffers the first let go of (the second's
  // result still held the ones it made): whatever they held before, the plan
  // is written anew.
  const int P = 4;
  const Token S = Token{64} * P;
  const IndexMask mask = dsa(S, 1, 5);
  const Session whole = whole_owner(mask, P);
  RankSessions rs(mask, P, "owner");
  const Rank r = 2;
  Session& mine = rs.ranks[static_cast<std::size_t>(r)];
  const auto own = rows_of(mask, rs.shards.blocks[static_cast<std::size_t>(r)]);
  std::vector<const std::int32_t*> pools;
  for (int call = 0; call < 3; ++call) {
    CAPTURE(call);
    mine.solve_topk_summaries(rs.summaries, own, S, 1);
    CHECK(mine.calc_meta(r, Pass::fwd) == whole.calc_meta(r, Pass::fwd));
    CHECK(mine.calc_meta(r, Pass::bwd) == whole.calc_meta(r, Pass::bwd));
    CHECK(mine.calc_meta(r, Pass::bwd).indices.shares(mine.calc_meta(r, Pass::fwd).indices));
    pools.push_back(mine.calc_meta(r, Pass::fwd).indices.data());  // compared as addresses only
  }
  CHECK(pools[1] != pools[0]);
  CHECK(pools[2] == pools[0]);
}

namespace {

// The args of a plan from row runs are those of the plan from the rows but
// for `k`, the cell's key hull (the arg's own is known only with its keys).
void check_same_args_but_k(const std::vector<AttnArg>& deferred, const std::vector<AttnArg>& rows, const CalcMeta& calc) {
  REQUIRE(deferred.size() == rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    AttnArg a = deferred[i];
    CHECK(a.k.begin <= rows[i].k.begin);
    CHECK(a.k.end >= rows[i].k.end);
    a.k = rows[i].k;
    CHECK(a == rows[i]);
    CHECK(arg_area(rows[i], calc) == a.index_area);
  }
}

}  // namespace

TEST_CASE("a rank's plan from row runs leaves its index pool to the executor, which writes what the builder would") {
  int checked = 0;
  for (int P : {2, 3, 4, 8}) {
    const Token S = Token{64} * P + 5;
    for (int H : {1, 2}) {
      const IndexMask mask = dsa(S, H, P + H);
      for (int bpr : {1, 2}) {
        for (int stages : {1, PlanShape::kAutoStages}) {
          CAPTURE(P);
          CAPTURE(H);
          CAPTURE(bpr);
          CAPTURE(stages);
          const Sharding shards = Sharding::sequential(S, P, 1);
          std::vector<Session> ranks;
          std::vector<std::vector<IndexCell>> summaries;
          std::vector<TopkRowRuns> runs;
          for (Rank r = 0; r < P; ++r) {
            ranks.emplace_back(options(P, bpr, stages, "balanced_bytes", r));
            const auto own = rows_of(mask, shards.blocks[static_cast<std::size_t>(r)]);
            summaries.push_back(ranks.back().summarize_topk(own, S, H));
            runs.push_back(ranks.back().summarize_topk_runs(own, S, H));
            CHECK(runs.back().cells == summaries.back());
          }
          for (Rank r = 0; r < P; ++r) {
            CAPTURE(r);
            const Range mine = shards.blocks[static_cast<std::size_t>(r)];
            Session by_rows(options(P, bpr, stages, "balanced_bytes", r));
            by_rows.solve_topk_summaries(summaries, rows_of(mask, mine), S, H);
            Session& by_runs = ranks[static_cast<std::size_t>(r)];
            by_runs.solve_topk_runs(summaries, runs[static_cast<std::size_t>(r)]);
            CHECK(by_runs.plan().only_rank == r);
            CHECK(by_runs.assignment().rank == by_rows.assignment().rank);
            CHECK(by_runs.metrics().fwd.total_send == by_rows.metrics().fwd.total_send);
            CHECK(by_runs.validate() == std::vector<std::string>{});
            TopkRows own;
            own.seqlen = S;
            own.first_row = mine.begin;
            own.indices = IndexArray::view(rows_of(mask, mine), {mine.size(), H, mask.indices.shape[2]}, "own");
            for (Pass pass : {Pass::fwd, Pass::bwd}) {
              const PassPlan& d = pass_plan(by_runs.plan().ranks[static_cast<std::size_t>(r)], pass);
              const PassPlan& w = pass_plan(by_rows.plan().ranks[static_cast<std::size_t>(r)], pass);
              CHECK(d.calc.indices.empty());
              CHECK(d.calc.deferred_index_entries == static_cast<std::int64_t>(w.calc.indices.size()));
              check_same_args_but_k(d.calc.local_attn_args, w.calc.local_attn_args, w.calc);
              REQUIRE(d.calc.remote_attn_args.size() == w.calc.remote_attn_args.size());
              for (std::size_t st = 0; st < w.calc.remote_attn_args.size(); ++st)
                check_same_args_but_k(d.calc.remote_attn_args[st], w.calc.remote_attn_args[st], w.calc);
              CHECK(d.comm.stages == w.comm.stages);
              Token kv_rows = 0;
              for (const StageComm& st : d.comm.stages) kv_rows += st.num_remote_kv_tokens;
              Token listed = 0;
              for (const RemoteRun& x : d.comm.remote_kv_rows) listed += x.tokens.size();
              CHECK(listed == kv_rows);
              CHECK(write_deferred_index_rows(d, by_runs.plan().sharding, r, own) == w.calc.indices.to_vector());
            }
            ++checked;
          }
        }
      }
    }
  }
  CHECK(checked == 2 * 2 * 2 * (2 + 3 + 4 + 8));
}

namespace {

// Four ranks of one small DSA mask, each with its session and summary.
struct FourRanks {
  static constexpr int P = 4;
  static constexpr Token S = 256;
  IndexMask mask = dsa(S, 1, 3);
  RankSessions rs{mask, P, "balanced_bytes"};
  Sharding& shards = rs.shards;
  std::vector<Session>& ranks = rs.ranks;
  std::vector<std::vector<IndexCell>>& summaries = rs.summaries;
};

}  // namespace

TEST_CASE("row runs that are not of the summarised rows are refused by name") {
  FourRanks f;
  const Token S = FourRanks::S;
  const IndexMask& mask = f.mask;
  const Sharding& shards = f.shards;
  std::vector<Session>& ranks = f.ranks;
  const std::vector<std::vector<IndexCell>>& summaries = f.summaries;
  Session& one = ranks[1];
  const TopkRowRuns good = one.summarize_topk_runs(rows_of(mask, shards.blocks[1]), S, 1);
  CHECK_THROWS_WITH_AS(one.solve_topk_runs(summaries, ranks[2].summarize_topk_runs(rows_of(mask, shards.blocks[2]), S, 1)),
                       "session: the row runs are of the queries [128, 192), rank 1's are [64, 128)", Error);
  TopkRowRuns wide = good;
  wide.width[0] = 0;
  CHECK_THROWS_WITH_AS(one.solve_topk_runs(summaries, wide),
                       doctest::Contains("row runs: run 0 (queries [64, "), Error);
  TopkRowRuns short_runs = good;
  short_runs.area.pop_back();
  CHECK_THROWS_WITH_AS(one.solve_topk_runs(summaries, short_runs),
                       doctest::Contains("areas for the"), Error);
  std::vector<std::vector<IndexCell>> other = summaries;
  other[1] = summaries[2];
  for (IndexCell& c : other[1]) c.qblock = 1;
  // Rank 2's cells under rank 1's name: no rows of rank 1 give them.
  CHECK_THROWS_WITH_AS(one.solve_topk_runs(other, good),
                       doctest::Contains("summaries[1] (rank 1's top-k summary): cell 0 (head 0, qblock 1, kblock 0): "
                                         "rows [128, "),
                       Error);
  // A summary that rows of rank 1 could give, but not these rows.
  other[1] = summaries[1];
  other[1].pop_back();
  CHECK_THROWS_WITH_AS(one.solve_topk_runs(other, good), doctest::Contains("the summary is not of these rows"), Error);
  one.solve_topk_runs(summaries, good);
  CHECK(one.plan().ranks[1].fwd.calc.deferred_index_entries > 0);
}

TEST_CASE("per-rank summaries: a session without a rank, wrong counts, order or rows are refused by name") {
  FourRanks f;
  const int P = FourRanks::P;
  const Token S = FourRanks::S;
  const IndexMask& mask = f.mask;
  const Sharding& shards = f.shards;
  std::vector<Session>& ranks = f.ranks;
  const std::vector<std::vector<IndexCell>>& summaries = f.summaries;
  const auto own = rows_of(mask, shards.blocks[1]);
  Session& one = ranks[1];

  Session no_rank(options(P, 1, 1, "owner", -1));
  CHECK_THROWS_WITH_AS(no_rank.summarize_topk(own, S, 1),
                       "session: per-rank top-k summaries need the session's rank (SessionOptions::rank, Python rank=)",
                       Error);
  CHECK_THROWS_WITH_AS(one.summarize_topk(own.subspan(0, own.size() - 1), S, 1),
                       "session: rank 1's 3071 top-k indices are not its rows [64, 128) as [64, kv_heads = 1, k]", Error);
  CHECK_THROWS_WITH_AS(one.solve_topk_summaries({summaries.begin(), summaries.begin() + 3}, own, S, 1),
                       "session: 3 top-k summaries given for P = 4 ranks (one per rank, in rank order)", Error);
  std::vector<std::vector<IndexCell>> swapped = summaries;
  std::swap(swapped[0], swapped[2]);
  CHECK_THROWS_WITH_AS(one.solve_topk_summaries(swapped, own, S, 1),
                       doctest::Contains("summaries[0] (rank 0's top-k summary): cell 0 (head 0, qblock 2, kblock 0): "
                                         "qblock 2 is not one of the rank's query blocks (its queries are [0, 64))"),
                       Error);
  // Rows that are not the ones summarised: another rank's.
  CHECK_THROWS_WITH_AS(one.solve_topk_summaries(summaries, rows_of(mask, shards.blocks[2]), S, 1),
                       doctest::Contains("the summary is not of these rows"), Error);
  one.solve_topk_summaries(summaries, own, S, 1);
  CHECK_THROWS_WITH_AS(one.calc_meta(2), doctest::Contains("builds rank 1's plan only"), Error);
}

TEST_CASE("a gathered summary that no rows could give is refused by every rank with the same error, before its own rows") {
  FourRanks f;
  const Token S = FourRanks::S;
  struct Lie {
    const char* what;
    void (*apply)(std::vector<IndexCell>&);
  };
  const Lie lies[] = {
      {"area -5 is outside", [](std::vector<IndexCell>& c) { c[0].area = -5; }},
      {"area 0 is outside", [](std::vector<IndexCell>& c) { c[0].area = 0; }},
      {"is outside [", [](std::vector<IndexCell>& c) { c[0].area = Token{1} << 62; }},
      {"repeats cell", [](std::vector<IndexCell>& c) { c.push_back(c.back()); }},
      {"reach outside its query block", [](std::vector<IndexCell>& c) { c[0].rows = RangeSet{{200, 210}}; }},
      {"reach outside its key block", [](std::vector<IndexCell>& c) { c[0].cols = RangeSet{{0, 256}}; }},
      {"is not one of the rank's query blocks", [](std::vector<IndexCell>& c) { c[0].qblock = 0; }},
  };
  for (const Lie& lie : lies) {
    CAPTURE(lie.what);
    std::vector<std::vector<IndexCell>> gathered = f.summaries;
    lie.apply(gathered[2]);
    std::string first;
    for (Rank r = 0; r < FourRanks::P; ++r) {
      CAPTURE(r);
      // Each rank's own rows are even another rank's here: the gathered summaries are checked first.
      const std::string e = test::error_of([&] {
        f.ranks[static_cast<std::size_t>(r)].solve_topk_summaries(gathered, rows_of(f.mask, f.shards.blocks[1]), S, 1);
      });
      CHECK(e.starts_with("summaries[2] (rank 2's top-k summary): cell "));
      CHECK(e.find(lie.what) != std::string::npos);
      if (r == 0) first = e;
      CHECK(e == first);
      TopkRowRuns runs = f.ranks[static_cast<std::size_t>(r)].summarize_topk_runs(
          rows_of(f.mask, f.shards.blocks[static_cast<std::size_t>(r)]), S, 1);
      CHECK(test::error_of([&] { f.ranks[static_cast<std::size_t>(r)].solve_topk_runs(gathered, runs); }) == first);
    }
  }
}
