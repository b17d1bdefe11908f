// Per-rank summaries of a token top-k mask (summary.hpp): every rank's rows
// counted alone and merged equal count_index_cells over the whole tensor, on
// fine blocks and coarsened to coarser shardings; the rows' errors name the
// rank's array and the query token.
#include <doctest/doctest.h>

#include <cstdint>
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
