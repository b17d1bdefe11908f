// Per-rank summaries of a token top-k mask (summary.hpp): every rank's rows
// counted alone and merged equal count_index_cells over the whole tensor, on
// fine blocks and coarsened to coarser shardings; the rows' errors name the
// rank's array and the query token.
#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/index/cells.hpp"
#include "cpsched/mask/index/summary.hpp"
#include "cpsched/problem/problem.hpp"
#include "index_cell_checks.hpp"
#include "random_index_masks.hpp"
#include "test_helpers.hpp"

using namespace cpsched;
using test::error_of;

namespace {

// Rank r's rows of `mask` as that rank holds them: a view of its slice.
TopkRows rows_of(const IndexMask& mask, Range rows, const std::string& src) {
  const std::int64_t H = mask.indices.shape[1], k = mask.indices.shape[2];
  TopkRows t;
  t.seqlen = mask.seqlen;
  t.first_row = rows.begin;
  t.causal = mask.causal;
  t.indices = IndexArray::view({mask.indices.data + rows.begin * H * k, static_cast<std::size_t>(rows.size() * H * k)},
                               {rows.size(), H, k}, src);
  return t;
}

// Every rank's summary of the ranks' shards (blocks_per_rank blocks each).
std::vector<IndexCell> merged_summaries(const IndexMask& mask, int P, int blocks_per_rank, IndexCountOptions o) {
  const Sharding sh = Sharding::sequential(mask.seqlen, P, blocks_per_rank);
  const Sharding ranks = Sharding::sequential(mask.seqlen, P, 1);
  std::vector<std::vector<IndexCell>> parts;
  for (int r = 0; r < P; ++r)
    parts.push_back(summarize_topk_rows(rows_of(mask, ranks.blocks[static_cast<std::size_t>(r)], "rank.npy"),
                                        sh.blocks, o));
  return merge_index_cells(parts);
}

IndexMask dsa_mask(Token S, int kv_heads, int pack) { return test::small_dsa(S, kv_heads, pack, 96, 8, 32); }

}  // namespace

TEST_CASE("summaries of every rank's rows merge into the whole tensor's cells") {
  for (int P : {2, 3, 4, 8}) {
    for (int H : {1, 2}) {
      const Token S = Token{96} * P;
      const IndexMask mask = dsa_mask(S, H, P);
      for (int bpr : {1, 2, 4}) {
        for (bool per_head : {true, false}) {
          // Threads cut a rank's rows anywhere, inside its blocks too: the cells are one thread's.
          for (int threads : {1, 2, 3, 7}) {
            CAPTURE(P);
            CAPTURE(H);
            CAPTURE(bpr);
            CAPTURE(per_head);
            CAPTURE(threads);
            const Sharding sh = Sharding::sequential(S, P, bpr);
            test::check_same_cells(merged_summaries(mask, P, bpr, {per_head, threads}),
                                   count_index_cells(mask, sh.blocks, {per_head, 1}));
          }
        }
      }
    }
  }
}

TEST_CASE("fine summaries coarsen to the cells of coarser shardings") {
  for (int P : {2, 3, 8}) {
    const Token S = Token{128} * P;
    const IndexMask mask = dsa_mask(S, 1, 7);
    const std::vector<IndexCell> fine = merged_summaries(mask, P, 8, {});
    const Sharding f = Sharding::sequential(S, P, 8);
    for (int bpr : {1, 2, 4, 8}) {
      CAPTURE(P);
      CAPTURE(bpr);
      const Sharding c = Sharding::sequential(S, P, bpr);
      test::check_same_cells(coarsen_index_cells(fine, f.blocks, c.blocks), count_index_cells(mask, c.blocks));
    }
  }
}

TEST_CASE("a summary of the same rows twice doubles the areas and keeps the rows and keys") {
  const Token S = 256;
  const IndexMask mask = dsa_mask(S, 1, 0);
  const Sharding sh = Sharding::sequential(S, 2, 1);
  const auto one = summarize_topk_rows(rows_of(mask, {0, 128}, "r0.npy"), sh.blocks);
  const auto twice = merge_index_cells({one, one});
  REQUIRE(twice.size() == one.size());
  for (std::size_t i = 0; i < one.size(); ++i) {
    CHECK(twice[i].area == 2 * one[i].area);
    CHECK(twice[i].rows == one[i].rows);
    CHECK(twice[i].cols == one[i].cols);
  }
}

TEST_CASE("summarize_topk_rows: bad rows name the rank's array, its row and the query token") {
  const Token S = 64;
  std::vector<std::int32_t> v(static_cast<std::size_t>(16 * 1 * 2), -1);
  const Sharding sh = Sharding::sequential(S, 4, 1);
  TopkRows t;
  t.seqlen = S;
  t.first_row = 32;
  t.indices = IndexArray::view(v, {16, 1, 2}, "rank2.npy");
  CHECK(summarize_topk_rows(t, sh.blocks).empty());  // all -1: no cell
  v[5 * 2 + 1] = 64;
  CHECK(error_of([&] { summarize_topk_rows(t, sh.blocks); }) ==
        "rank2.npy: indices[5, 0, 1] = 64 (query token 37) is outside [0, 64)");
  v[5 * 2 + 1] = 40;
  CHECK(error_of([&] { summarize_topk_rows(t, sh.blocks); }) ==
        "rank2.npy: indices[5, 0, 1] = 40 (query token 37) selects a key after query 37 (causal: true)");
  v[5 * 2 + 0] = 3;
  v[5 * 2 + 1] = 3;
  CHECK(error_of([&] { summarize_topk_rows(t, sh.blocks); }) ==
        "rank2.npy: indices[5, 0, 1] = 3 (query token 37) selects key 3 twice in row [5, 0] (also indices[5, 0, 0])");
  v[5 * 2 + 1] = -1;
  CHECK(summarize_topk_rows(t, sh.blocks).size() == 1);

  t.first_row = 40;
  CHECK(error_of([&] { summarize_topk_rows(t, sh.blocks); }) ==
        "rank2.npy: the rows [40, 56) cut block [32, 48) at token 40: a rank's rows must be whole blocks");
  t.first_row = 56;
  CHECK(error_of([&] { summarize_topk_rows(t, sh.blocks); }) ==
        "rank2.npy: the rows [56, 72) (first_row 56 + 16 rows) are outside the sequence [0, 64)");
  t.first_row = 32;
  t.indices = IndexArray::view(v, {32}, "rank2.npy");
  CHECK(error_of([&] { summarize_topk_rows(t, sh.blocks); }) ==
        "rank2.npy: shape [32] has 1 dimensions (expected a rank's rows [rows, H_kv, k])");
}

TEST_CASE("coarsen_index_cells: a coarse block must start on a fine boundary") {
  const std::vector<Range> fine{{0, 4}, {4, 8}}, coarse{{0, 6}, {6, 8}};
  CHECK(error_of([&] { coarsen_index_cells({}, fine, coarse); }) ==
        "coarsen_index_cells: coarse block 1 = [6, 8) starts inside fine block [4, 8)");
}

TEST_CASE("check_rank_summary: every rank's honest summary passes, on every grid and head count") {
  for (int P : {2, 3, 8}) {
    for (int H : {1, 2}) {
      const Token S = Token{96} * P + 5;
      const IndexMask mask = dsa_mask(S, H, P);
      for (int bpr : {1, 2}) {
        const Sharding sh = Sharding::sequential(S, P, bpr);
        const Sharding ranks = Sharding::sequential(S, P, 1);
        for (int r = 0; r < P; ++r) {
          const Range mine = ranks.blocks[static_cast<std::size_t>(r)];
          const auto cells = summarize_topk_rows(rows_of(mask, mine, "rank.npy"), sh.blocks);
          CAPTURE(P);
          CAPTURE(H);
          CAPTURE(bpr);
          CAPTURE(r);
          CHECK_NOTHROW(check_rank_summary(cells, sh.blocks, mine, H, true, "s"));
          CHECK_NOTHROW(check_rank_summary(cells, sh.blocks, mine, H, false, "s"));
        }
      }
    }
  }
}

TEST_CASE("check_rank_summary: a summary that no rows of the rank could give names the cell, the field and the value") {
  const Token S = 96;
  const int P = 3;
  const IndexMask mask = dsa_mask(S, 1, 1);
  const Sharding sh = Sharding::sequential(S, P, 1);
  const Range mine = sh.blocks[1];  // [32, 64)
  const std::vector<IndexCell> honest = summarize_topk_rows(rows_of(mask, mine, "rank1.npy"), sh.blocks);
  REQUIRE(honest.size() >= 2);
  auto err = [&](const std::function<void(std::vector<IndexCell>&)>& lie, bool causal = true, int heads = 1) {
    std::vector<IndexCell> c = honest;
    lie(c);
    return error_of([&] { check_rank_summary(c, sh.blocks, mine, heads, causal, "summaries[1] (rank 1's)"); });
  };
  using C = std::vector<IndexCell>;
  const std::string c0 = "summaries[1] (rank 1's): cell 0 (head 0, qblock 1, kblock 0)";
  CHECK(err([](C& c) { c[0].area = -5; }).starts_with(c0 + ": area -5 is outside ["));
  CHECK(err([](C& c) { c[0].area = 0; }).starts_with(c0 + ": area 0 is outside ["));
  CHECK(err([](C& c) { c[0].area = Token{1} << 62; }).starts_with(c0 + ": area 4611686018427387904 is outside ["));
  // The pairs 32 rows x 32 keys can hold.
  CHECK(err([](C& c) { c[0].rows = RangeSet{{32, 64}}, c[0].cols = RangeSet{{0, 32}}, c[0].area = 1025; }) ==
        c0 + ": area 1025 is outside [32, 1024], the pairs its 32 rows and 32 keys need and can hold (causal)");
  // Causal: on the diagonal at most the triangle's pairs.
  CHECK(err([](C& c) { c[1].rows = RangeSet{{32, 64}}, c[1].cols = RangeSet{{32, 64}}, c[1].area = 529; })
            .ends_with(": area 529 is outside [32, 528], the pairs its 32 rows and 32 keys need and can hold (causal)"));
  CHECK_NOTHROW(err([](C& c) { c[1].rows = RangeSet{{32, 64}}, c[1].cols = RangeSet{{32, 64}}, c[1].area = 528; }));
  CHECK(err([](C& c) { c[0].head = 1; }) == "summaries[1] (rank 1's): cell 0 (head 1, qblock 1, kblock 0): head 1 is "
                                             "outside the 1 selection heads [0, 1)");
  CHECK(err([](C& c) { c[0].qblock = 0; }) ==
        "summaries[1] (rank 1's): cell 0 (head 0, qblock 0, kblock 0): qblock 0 is not one of the rank's query blocks "
        "(its queries are [32, 64)): a summary holds its own rows only");
  CHECK(err([](C& c) { c[0].kblock = 7; }) ==
        "summaries[1] (rank 1's): cell 0 (head 0, qblock 1, kblock 7): kblock 7 is outside the 3 blocks of S = 96");
  CHECK(err([](C& c) { c.push_back(c.back()); }).ends_with("repeats cell " + std::to_string(honest.size() - 1) +
                                                           " (head 0, qblock 1, kblock 1): cells come once each, "
                                                           "sorted by (head, qblock, kblock)"));
  CHECK(err([](C& c) { std::swap(c[0], c[1]); }).find("comes after cell 0") != std::string::npos);
  CHECK(err([](C& c) { c[0].rows = RangeSet{{72, 80}}; }) == c0 + ": rows [72, 80) reach outside its query block [32, 64)");
  CHECK(err([](C& c) { c[0].cols = RangeSet{{0, 40}}; }) == c0 + ": keys [0, 40) reach outside its key block [0, 32)");
  CHECK(err([](C& c) { c[0].cols = RangeSet{}; }) == c0 + ": no keys (a cell holds a selection)");
  CHECK(err([](C& c) { c[1].cols = RangeSet{{40, 64}}, c[1].rows = RangeSet{{34, 63}}; }).find("are not causal (key 63 > row 62)") !=
        std::string::npos);
  // Not causal: a key after its rows is allowed, the bound is rows x keys.
  CHECK_NOTHROW(err([](C& c) { c[1].cols = RangeSet{{40, 64}}, c[1].rows = RangeSet{{34, 63}}; }, false));
  CHECK(err([](C&) {}, true, 0).find("head 0 is outside the 0 selection heads") != std::string::npos);
}
