// Index masks: IndexArray, validate()'s errors (exact messages, the first
// offending entry whatever the thread count), area(), and count_index_cells
// against a brute-force count on small random masks.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstdint>
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/index/cells.hpp"
#include "cpsched/mask/index/index_mask.hpp"
#include "cpsched/problem/problem.hpp"
#include "index_cell_checks.hpp"
#include "test_helpers.hpp"

using namespace cpsched;
using test::error_of;

namespace {

// A topk mask over S tokens, H heads, k slots; row (i, h) from `row(i, h)`.
IndexMask topk_mask(std::vector<std::int32_t>& store, Token S, int H, int k, bool causal, const std::string& src = "t.npy") {
  IndexMask m;
  m.kind = IndexMaskKind::topk;
  m.seqlen = S;
  m.kv_heads = H;
  m.causal = causal;
  m.indices = IndexArray::view(store, {S, H, k}, src);
  return m;
}

// Random distinct keys per row, -1 padded at random slots.
std::vector<std::int32_t> random_topk(std::mt19937_64& rng, Token S, int H, int k, bool causal) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(S * H * k), -1);
  for (Token i = 0; i < S; ++i)
    for (int h = 0; h < H; ++h) {
      const Token n = causal ? i + 1 : S;
      std::vector<std::int32_t> keys;
      for (Token x = 0; x < n; ++x) keys.push_back(static_cast<std::int32_t>(x));
      std::shuffle(keys.begin(), keys.end(), rng);
      const int take = static_cast<int>(std::min<Token>(n, std::uniform_int_distribution<int>(0, k)(rng)));
      std::vector<int> slots(static_cast<std::size_t>(k));
      for (int j = 0; j < k; ++j) slots[static_cast<std::size_t>(j)] = j;
      std::shuffle(slots.begin(), slots.end(), rng);
      for (int x = 0; x < take; ++x)
        v[static_cast<std::size_t>((i * H + h) * k + slots[static_cast<std::size_t>(x)])] = keys[static_cast<std::size_t>(x)];
    }
  return v;
}

using CellKey = std::tuple<int, int, int>;  // head, qblock, kblock
struct BruteCell {
  Token area = 0;
  std::set<Token> rows, cols;
};

std::map<CellKey, BruteCell> brute_count(const IndexMask& m, const std::vector<Range>& blocks, bool per_head) {
  auto block_of = [&](Token t) {
    for (std::size_t b = 0; b < blocks.size(); ++b)
      if (blocks[b].contains(t)) return static_cast<int>(b);
    return -1;
  };
  std::map<CellKey, BruteCell> out;
  const Token k = m.indices.shape[2];
  for (Token i = 0; i < m.seqlen; ++i)
    for (int h = 0; h < m.kv_heads; ++h)
      for (Token j = 0; j < k; ++j) {
        const std::int32_t v = m.indices.data[(i * m.kv_heads + h) * k + j];
        if (v < 0) continue;
        BruteCell& c = out[{per_head ? h : 0, block_of(i), block_of(v)}];
        c.area += 1;
        c.rows.insert(i);
        c.cols.insert(v);
      }
  return out;
}

std::set<Token> tokens_of(const RangeSet& s) {
  std::set<Token> out;
  for (Range r : s.ranges())
    for (Token t = r.begin; t < r.end; ++t) out.insert(t);
  return out;
}

// Checks counted cells against brute_count's (std::map order = (head,
// qblock, kblock)); returns the pairs they hold.
__int128 check_brute(const std::vector<IndexCell>& got, const std::map<CellKey, BruteCell>& want) {
  REQUIRE(got.size() == want.size());
  __int128 total = 0;
  std::size_t x = 0;
  for (const auto& [key, bc] : want) {
    const IndexCell& cell = got[x++];
    CHECK(CellKey{cell.head, cell.qblock, cell.kblock} == key);
    CHECK(cell.area == bc.area);
    CHECK(tokens_of(cell.rows) == bc.rows);
    CHECK(tokens_of(cell.cols) == bc.cols);
    total += cell.area;
  }
  return total;
}

}  // namespace

TEST_CASE("IndexArray: size, view, copy, int64 narrowing") {
  std::vector<std::int32_t> a{1, 2, 3, 4, 5, 6};
  const IndexArray v = IndexArray::view(a, {2, 3}, "<a>");
  CHECK(v.size() == 6);
  CHECK(v.data == a.data());
  CHECK(!v.empty());
  CHECK(IndexArray{}.size() == 0);
  CHECK(IndexArray{}.empty());
  const IndexArray c = IndexArray::copy(std::span<const std::int32_t>(a), {3, 2}, "<c>");
  CHECK(c.data != a.data());
  CHECK(std::vector<std::int32_t>(c.span().begin(), c.span().end()) == a);
  std::vector<std::int64_t> w{0, -1, 7};
  const IndexArray n = IndexArray::copy(std::span<const std::int64_t>(w), {3}, "w.npy");
  CHECK(n.data[1] == -1);
  CHECK(n.data[2] == 7);
  w[2] = std::int64_t{1} << 40;
  CHECK(error_of([&] { IndexArray::copy(std::span<const std::int64_t>(w), {1, 3}, "w.npy"); }) ==
        "w.npy: entry [0, 2] (flat position 2) = 1099511627776 does not fit int32");
  CHECK(error_of([&] { IndexArray::view(a, {4, 2}, "<a>"); }) == "<a>: 6 values do not fill shape [4, 2] (8 values)");
}

TEST_CASE("topk validate: the first offending entry, by kind, with its multi-index") {
  const Token S = 8;
  std::vector<std::int32_t> v(static_cast<std::size_t>(S * 2 * 3), -1);
  auto set = [&](Token i, int h, int j, std::int32_t x) { v[static_cast<std::size_t>((i * 2 + h) * 3 + j)] = x; };
  for (Token i = 0; i < S; ++i) set(i, 0, 0, static_cast<std::int32_t>(i)), set(i, 1, 2, 0);
  IndexMask m = topk_mask(v, S, 2, 3, true, "dsa.npy");
  CHECK_NOTHROW(m.validate(1));
  CHECK(m.area() == 2 * S - 0);
  CHECK(m.area(0) == S);
  CHECK(m.area(1) == S);

  set(5, 0, 1, 8);
  CHECK(error_of([&] { m.validate(); }) == "dsa.npy: indices[5, 0, 1] = 8 is outside [0, 8)");
  set(5, 0, 1, -2);
  CHECK(error_of([&] { m.validate(); }) == "dsa.npy: indices[5, 0, 1] = -2 is outside [0, 8)");
  set(5, 0, 1, 6);
  CHECK(error_of([&] { m.validate(); }) == "dsa.npy: indices[5, 0, 1] = 6 selects a key after query 5 (causal: true)");
  m.causal = false;
  CHECK_NOTHROW(m.validate());
  CHECK(m.area() == 2 * S + 1);
  set(5, 0, 1, 5);
  CHECK(error_of([&] { m.validate(); }) ==
        "dsa.npy: indices[5, 0, 1] = 5 selects key 5 twice in row [5, 0] (also indices[5, 0, 0])");
  // A duplicate before an out-of-range entry in the same row is the first.
  set(5, 0, 2, 9);
  CHECK(error_of([&] { m.validate(); }) ==
        "dsa.npy: indices[5, 0, 1] = 5 selects key 5 twice in row [5, 0] (also indices[5, 0, 0])");
  CHECK(error_of([&] { count_index_cells(m, {{0, 8}}); }) ==
        "dsa.npy: indices[5, 0, 1] = 5 selects key 5 twice in row [5, 0] (also indices[5, 0, 0])");
  set(5, 0, 1, 3);
  CHECK(error_of([&] { m.validate(); }) == "dsa.npy: indices[5, 0, 2] = 9 is outside [0, 8)");
  set(5, 0, 2, -1);
  // An earlier error wins over a later one, whatever the threads.
  set(6, 1, 0, 100);
  set(2, 1, 1, 3);
  m.causal = true;
  for (int t : {1, 2, 3, 4, 8, 16})
    CHECK(error_of([&] { m.validate(t); }) == "dsa.npy: indices[2, 1, 1] = 3 selects a key after query 2 (causal: true)");
  for (int t : {1, 2, 5, 8}) {
    const auto blocks = Sharding::sequential(S, 4).blocks;
    CHECK(error_of([&] { count_index_cells(m, blocks, {true, t}); }) ==
          "dsa.npy: indices[2, 1, 1] = 3 selects a key after query 2 (causal: true)");
  }
}

TEST_CASE("count_index_cells: a duplicate in an unsorted row after many rows") {
  // Rows [i, 0] (unsorted): the duplicate checks run for hundreds of rows first.
  const Token S = 700;
  std::vector<std::int32_t> v;
  for (Token i = 0; i < S; ++i) v.push_back(static_cast<std::int32_t>(i)), v.push_back(0), v.push_back(-1);
  v[0 * 3 + 1] = -1;
  v[650 * 3 + 2] = 0;
  IndexMask m = topk_mask(v, S, 1, 3, true, "u.npy");
  for (int t : {1, 2, 3})
    CHECK(error_of([&] { count_index_cells(m, {{0, 100}, {100, 700}}, {true, t}); }) ==
          "u.npy: indices[650, 0, 2] = 0 selects key 0 twice in row [650, 0] (also indices[650, 0, 1])");
  v[650 * 3 + 2] = 1;
  CHECK(count_index_cells(m, {{0, 100}, {100, 700}}).size() == 3);
}

TEST_CASE("count_index_cells: rows in the usual layout (keys first, ascending, then -1) and their errors") {
  // Such rows are counted without a check per entry; any other row, and any
  // error, goes through the checked scan: the same errors as validate() and
  // the same cells as brute force.
  const Token S = 300;
  const int k = 40;
  std::mt19937_64 rng(11);
  std::vector<std::int32_t> v(static_cast<std::size_t>(S * k), -1);
  for (Token i = 0; i < S; ++i) {
    std::vector<std::int32_t> keys;
    for (Token x = 0; x <= i; ++x) keys.push_back(static_cast<std::int32_t>(x));
    std::shuffle(keys.begin(), keys.end(), rng);
    keys.resize(static_cast<std::size_t>(std::min<Token>(i + 1, std::uniform_int_distribution<int>(0, k)(rng))));
    std::sort(keys.begin(), keys.end());
    std::copy(keys.begin(), keys.end(), v.begin() + i * k);
  }
  IndexMask m = topk_mask(v, S, 1, k, true, "p.npy");
  const auto blocks = Sharding::sequential(S, 3, 2).blocks;
  auto check_counts = [&] {
    const auto want = brute_count(m, blocks, true);
    for (int t : {1, 2, 3}) {
      check_brute(count_index_cells(m, blocks, {true, t}), want);
    }
  };
  check_counts();
  auto at = [&](Token i, int j) -> std::int32_t& { return v[static_cast<std::size_t>(i * k + j)]; };
  auto same_error = [&](const std::string& want) {
    CHECK(error_of([&] { m.validate(); }) == want);
    for (int t : {1, 2, 3}) CHECK(error_of([&] { count_index_cells(m, blocks, {true, t}); }) == want);
  };
  // The last key after the query, a duplicate, a bad negative entry.
  const Token i = 200;
  int c = 0;
  while (c < k && at(i, c) >= 0) ++c;
  REQUIRE(c >= 3);
  const std::int32_t last = at(i, c - 1);
  at(i, c - 1) = static_cast<std::int32_t>(i + 1);
  same_error(fmt::format("p.npy: indices[200, 0, {}] = 201 selects a key after query 200 (causal: true)", c - 1));
  at(i, c - 1) = at(i, c - 2);
  same_error(fmt::format("p.npy: indices[200, 0, {}] = {} selects key {} twice in row [200, 0] (also indices[200, 0, {}])",
                         c - 1, at(i, c - 2), at(i, c - 2), c - 2));
  at(i, c - 1) = -2;
  same_error(fmt::format("p.npy: indices[200, 0, {}] = -2 is outside [0, 300)", c - 1));
  // A -1 among the keys and a row out of order: another layout, counted all the same.
  at(i, c - 1) = last;
  std::swap(at(i, 0), at(i, 1));
  check_counts();
  std::swap(at(i, 0), at(i, 1));
  at(i, k - 1) = at(i, 1);
  at(i, 1) = -1;
  check_counts();
}

TEST_CASE("topk validate: shapes against S and kv_heads") {
  std::vector<std::int32_t> v(4096 * 2 * 4, -1);
  IndexMask m;
  m.seqlen = 8192;
  m.kv_heads = 1;
  m.indices = IndexArray::view(v, {4096, 2, 4}, "dsa.npy");
  CHECK(error_of([&] { m.validate(); }) == "dsa.npy: shape [4096, 2, 4] does not match S = 8192 (expected [8192, H_kv, k])");
  m.seqlen = 4096;
  CHECK(error_of([&] { m.validate(); }) == "dsa.npy: shape [4096, 2, 4] does not match kv_heads = 1 (expected [4096, 1, k])");
  m.indices = IndexArray::view(v, {4096, 8}, "dsa.npy");
  CHECK(error_of([&] { m.validate(); }) ==
        "dsa.npy: shape [4096, 8] has 2 dimensions (expected [S, H_kv, k] = [4096, 1, k])");
  m.kv_heads = 2;
  m.indices = IndexArray::view(v, {4096, 2, 4}, "dsa.npy");
  CHECK_NOTHROW(m.validate());
  m.seqlen = 0;
  CHECK(error_of([&] { m.validate(); }) == "index mask: S = 0 must be in [1, 2147483647]");
}

TEST_CASE("count_index_cells matches a brute-force count; any thread count gives the same cells") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const Token S = std::uniform_int_distribution<Token>(5, 70)(rng);
    const int H = std::uniform_int_distribution<int>(1, 3)(rng);
    const int k = std::uniform_int_distribution<int>(1, 9)(rng);
    const bool causal = trial % 3 != 0;
    std::vector<std::int32_t> v = random_topk(rng, S, H, k, causal);
    // Half the trials with sorted rows (the counting pass's fast path).
    if (trial % 2 == 0)
      for (std::size_t r = 0; r < v.size(); r += static_cast<std::size_t>(k)) std::sort(v.begin() + r, v.begin() + r + k);
    const IndexMask m = topk_mask(v, S, H, k, causal);
    CHECK_NOTHROW(m.validate());
    for (int P : {2, 3, 5}) {
      for (int c : {1, 2}) {
        if (Token{P} * c > S) continue;
        const auto blocks = Sharding::sequential(S, P, c).blocks;
        for (bool per_head : {true, false}) {
          const auto want = brute_count(m, blocks, per_head);
          const auto got = count_index_cells(m, blocks, {per_head, 1});
          CHECK(check_brute(got, want) == m.area());
          for (int t : {2, 3, 7}) {
            test::check_same_cells(count_index_cells(m, blocks, {per_head, t}), got);
          }
        }
      }
    }
  }
}

TEST_CASE("count_index_cells: blocks of >= 64 tokens (the coarse token-to-block lookup) match brute force") {
  std::mt19937_64 rng(8);
  const Token S = 389;
  for (bool causal : {true, false}) {
    std::vector<std::int32_t> v = random_topk(rng, S, 2, 24, causal);
    const IndexMask m = topk_mask(v, S, 2, 24, causal);
    for (auto blocks : {Sharding::sequential(S, 3).blocks, Sharding::sequential(S, 3, 2).blocks,
                        std::vector<Range>{{0, 64}, {64, 200}, {200, 264}, {264, 389}}}) {
      const auto want = brute_count(m, blocks, true);
      check_brute(count_index_cells(m, blocks, {true, 2}), want);
    }
  }
}

TEST_CASE("count_index_cells: blocks must tile [0, S); block kinds are refused") {
  std::vector<std::int32_t> v{0, -1, 1, 0};
  IndexMask m = topk_mask(v, 2, 1, 2, true);
  CHECK(error_of([&] { count_index_cells(m, {{0, 1}, {2, 2}}); }) ==
        "count_index_cells: block 1 = [2, 2) does not continue the tiling of [0, 2) at 1");
  CHECK(error_of([&] { count_index_cells(m, {{0, 1}}); }) == "count_index_cells: the blocks end at 1, not at S = 2");
  const auto cells = count_index_cells(m, {{0, 1}, {1, 2}});
  REQUIRE(cells.size() == 3);
  CHECK(cells[1].rows == RangeSet{{1, 2}});
  CHECK(cells[1].cols == RangeSet{{0, 1}});
  CHECK(cells[1].kblock == 0);
  m.kind = IndexMaskKind::block_topk;
  CHECK(error_of([&] { count_index_cells(m, {{0, 2}}); }) ==
        "count_index_cells: a block_topk mask is a range mask per head; use block_selection_masks");
}

TEST_CASE("block_topk validate: range, causality, duplicates, shape") {
  // S = 10, blocks of [2 queries, 4 keys]: 5 query blocks, 3 key blocks.
  std::vector<std::int32_t> v(1 * 5 * 2, -1);
  IndexMask m;
  m.kind = IndexMaskKind::block_topk;
  m.seqlen = 10;
  m.block_q = 2;
  m.block_k = 4;
  auto at = [&](int qb, int j) -> std::int32_t& { return v[static_cast<std::size_t>(qb * 2 + j)]; };
  for (int qb = 0; qb < 5; ++qb) at(qb, 0) = 0;
  at(2, 1) = 1;  // queries [4, 6) x keys [4, 8): straddles the diagonal
  m.indices = IndexArray::view(v, {1, 5, 2}, "nsa.npy");
  CHECK_NOTHROW(m.validate());
  // Block 0 keys [0, 4): rows 0,1 see 1,2 keys; rows 2,3 see 3,4; later rows 4 each.
  CHECK(m.area() == (1 + 2) + (3 + 4) + 4 * 6 + (1 + 2));
  at(1, 1) = 3;
  CHECK(error_of([&] { m.validate(); }) == "nsa.npy: indices[0, 1, 1] = 3 is outside [0, 3)");
  at(1, 1) = 1;
  CHECK(error_of([&] { m.validate(); }) ==
        "nsa.npy: indices[0, 1, 1] = 1 selects key block 1 (keys [4, 8)) after query block 1 (queries [2, 4)) (causal: true)");
  at(1, 1) = 0;
  CHECK(error_of([&] { m.validate(); }) == "nsa.npy: indices[0, 1, 1] = 0 selects key block 0 twice (also indices[0, 1, 0])");
  at(1, 1) = -1;
  m.indices = IndexArray::view(v, {1, 2, 5}, "nsa.npy");
  CHECK(error_of([&] { m.validate(); }) ==
        "nsa.npy: shape [1, 2, 5] does not match S = 10 and block_q = 2 (expected [H_kv, 5, n])");
  m.kv_heads = 2;
  m.indices = IndexArray::view(v, {1, 5, 2}, "nsa.npy");
  CHECK(error_of([&] { m.validate(); }) == "nsa.npy: shape [1, 5, 2] does not match kv_heads = 2 (expected [2, 5, n])");
}

TEST_CASE("bsr validate: indptr structure, partial and full lists") {
  // S = 8, blocks 4 x 4: 2 query blocks, 2 key blocks, two heads.
  std::vector<std::int32_t> indptr{0, 1, 3, 0, 0, 1};
  std::vector<std::int32_t> indices{0, 0, 1, 0};  // head 0: qb0 {0}, qb1 {0, 1}; head 1: qb1 {0}
  std::vector<std::int32_t> full_indptr{0, 0, 0, 0, 0, 1};
  std::vector<std::int32_t> full_indices{1};
  IndexMask m;
  m.kind = IndexMaskKind::bsr;
  m.seqlen = 8;
  m.kv_heads = 2;
  m.block_q = m.block_k = 4;
  m.indptr = IndexArray::view(indptr, {2, 3}, "indptr.npy");
  m.indices = IndexArray::view(indices, {4}, "indices.npy");
  CHECK_NOTHROW(m.validate());
  CHECK(m.area(0) == 10 + 16 + 10);
  CHECK(m.area(1) == 16);
  m.full_indptr = IndexArray::view(full_indptr, {2, 3}, "full_indptr.npy");
  m.full_indices = IndexArray::view(full_indices, {1}, "full_indices.npy");
  CHECK_NOTHROW(m.validate(3));
  CHECK(m.area(1) == 16 + 10);
  full_indices[0] = 0;
  CHECK(error_of([&] { m.validate(); }) ==
        "full_indices.npy: full_indices[0] = 0 (head 1, query block 1) is also in the partial list (indices[3]); a "
        "block is partial or full, not both");
  full_indices[0] = 1;
  indices[2] = 0;
  CHECK(error_of([&] { m.validate(); }) ==
        "indices.npy: indices[2] = 0 (head 0, query block 1) selects key block 0 twice (also indices[1])");
  indices[2] = 2;
  CHECK(error_of([&] { m.validate(); }) == "indices.npy: indices[2] = 2 (head 0, query block 1) is outside [0, 2)");
  indices[2] = 1;
  indices[0] = 1;
  CHECK(error_of([&] { m.validate(); }) ==
        "indices.npy: indices[0] = 1 (head 0, query block 0) selects key block 1 (keys [4, 8)) after query block 0 "
        "(queries [0, 4)) (causal: true)");
  indices[0] = 0;
  indptr[3] = 1;
  CHECK(error_of([&] { m.validate(); }) == "indptr.npy: indptr[1, 0] = 1, expected 0 (each head's row starts at 0)");
  indptr[3] = 0;
  indptr[1] = 4;
  CHECK(error_of([&] { m.validate(); }) ==
        "indptr.npy: indptr[0, 2] = 3 is less than indptr[0, 1] = 4 (an indptr row must not decrease)");
  indptr[1] = 1;
  m.indices = IndexArray::view(std::span<const std::int32_t>(indices).first(3), {3}, "indices.npy");
  CHECK(error_of([&] { m.validate(); }) ==
        "indices.npy: indices shape [3] does not match the 4 nnz of indptr (expected [4])");
  m.indices = IndexArray::view(indices, {4}, "indices.npy");
  m.indptr = IndexArray::view(indptr, {6}, "indptr.npy");
  CHECK(error_of([&] { m.validate(); }) ==
        "indptr.npy: indptr shape [6] does not match S = 8, block_q = 4 and kv_heads = 2 (expected [2, 3])");
  m.indptr = IndexArray::view(indptr, {2, 3}, "indptr.npy");
  m.full_indices = IndexArray{};
  CHECK(error_of([&] { m.validate(); }) == "full_indptr.npy: full_indptr and full_indices come together (got only full_indptr)");
}
