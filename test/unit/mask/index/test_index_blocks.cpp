// block_selection_masks: block_topk and bsr selections as range masks, exact
// against a brute-force statement of the selection (every selected pair in
// exactly one slice, nothing else), with rows and columns merged.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/index/index_mask.hpp"
#include "test_helpers.hpp"

using namespace cpsched;
using test::error_of;

namespace {

struct BlockCase {
  Token S;
  int bq, bk, H;
  bool causal;
  std::vector<std::vector<std::set<std::int32_t>>> partial, full;  // [h][qb]
};

BlockCase random_case(std::mt19937_64& rng, bool with_full) {
  BlockCase c;
  c.S = std::uniform_int_distribution<Token>(3, 40)(rng);
  c.bq = std::uniform_int_distribution<int>(1, 7)(rng);
  c.bk = std::uniform_int_distribution<int>(1, 7)(rng);
  c.H = std::uniform_int_distribution<int>(1, 2)(rng);
  c.causal = std::uniform_int_distribution<int>(0, 3)(rng) != 0;
  const Token nqb = (c.S + c.bq - 1) / c.bq, nkb = (c.S + c.bk - 1) / c.bk;
  c.partial.assign(static_cast<std::size_t>(c.H), std::vector<std::set<std::int32_t>>(static_cast<std::size_t>(nqb)));
  c.full = c.partial;
  const int density = std::uniform_int_distribution<int>(1, 4)(rng);
  for (int h = 0; h < c.H; ++h)
    for (Token qb = 0; qb < nqb; ++qb)
      for (Token kb = 0; kb < nkb; ++kb) {
        const Token last_q = std::min(c.S, (qb + 1) * c.bq) - 1;
        if (c.causal && kb * c.bk > last_q) continue;
        const int r = std::uniform_int_distribution<int>(0, 4)(rng);
        if (r < density) (with_full && r == 0 ? c.full : c.partial)[h][qb].insert(static_cast<std::int32_t>(kb));
      }
  return c;
}

bool selected(const BlockCase& c, int h, Token q, Token k) {
  if (c.causal && k > q) return false;
  const auto& p = c.partial[h][q / c.bq];
  const auto& f = c.full[h][q / c.bq];
  const auto kb = static_cast<std::int32_t>(k / c.bk);
  return p.count(kb) || f.count(kb);
}

void check_exact(const BlockCase& c, const std::vector<RangeMask>& masks) {
  REQUIRE(masks.size() == static_cast<std::size_t>(c.H));
  for (int h = 0; h < c.H; ++h) {
    const RangeMask& m = masks[static_cast<std::size_t>(h)];
    CHECK(m.seqlen() == c.S);
    CHECK_NOTHROW(m.validate());
    Token want_area = 0;
    for (Token q = 0; q < c.S; ++q)
      for (Token k = 0; k < c.S; ++k) {
        int covered = 0;
        for (const Slice& s : m.slices()) covered += slice_contains(s, q, k);
        const bool sel = selected(c, h, q, k);
        want_area += sel;
        if (covered != (sel ? 1 : 0)) {
          FAIL_CHECK("head " << h << " (" << q << ", " << k << ") covered " << covered << " times, selected " << sel);
          return;
        }
      }
    CHECK(m.area() == want_area);
  }
}

IndexMask block_topk_of(const BlockCase& c, std::vector<std::int32_t>& store) {
  const Token nqb = (c.S + c.bq - 1) / c.bq;
  std::size_t n = 1;
  for (const auto& hs : c.partial)
    for (const auto& s : hs) n = std::max(n, s.size() + 1);
  store.assign(static_cast<std::size_t>(c.H) * static_cast<std::size_t>(nqb) * n, -1);
  for (int h = 0; h < c.H; ++h)
    for (Token qb = 0; qb < nqb; ++qb) {
      // Unsorted, padding in the middle: the layout must not matter.
      std::vector<std::int32_t> v(c.partial[h][qb].rbegin(), c.partial[h][qb].rend());
      std::size_t slot = static_cast<std::size_t>((h * nqb + qb)) * n;
      for (std::size_t j = 0; j < v.size(); ++j) store[slot + (j == 0 ? n - 1 : j - 1)] = v[j];
    }
  IndexMask m;
  m.kind = IndexMaskKind::block_topk;
  m.seqlen = c.S;
  m.kv_heads = c.H;
  m.causal = c.causal;
  m.block_q = c.bq;
  m.block_k = c.bk;
  m.indices = IndexArray::view(store, {c.H, nqb, static_cast<std::int64_t>(n)}, "<nsa>");
  return m;
}

struct BsrStore {
  std::vector<std::int32_t> indptr, indices, full_indptr, full_indices;
};

IndexMask bsr_of(const BlockCase& c, BsrStore& st, bool with_full) {
  const Token nqb = (c.S + c.bq - 1) / c.bq;
  auto build = [&](const std::vector<std::vector<std::set<std::int32_t>>>& lists, std::vector<std::int32_t>& ptr,
                   std::vector<std::int32_t>& ix) {
    ptr.clear();
    ix.clear();
    for (int h = 0; h < c.H; ++h) {
      std::int32_t at = 0;
      ptr.push_back(0);
      for (Token qb = 0; qb < nqb; ++qb) {
        for (std::int32_t b : lists[h][qb]) ix.push_back(b), ++at;
        ptr.push_back(at);
      }
    }
  };
  build(c.partial, st.indptr, st.indices);
  IndexMask m;
  m.kind = IndexMaskKind::bsr;
  m.seqlen = c.S;
  m.kv_heads = c.H;
  m.causal = c.causal;
  m.block_q = c.bq;
  m.block_k = c.bk;
  std::vector<std::int64_t> pshape = c.H == 1 ? std::vector<std::int64_t>{nqb + 1} : std::vector<std::int64_t>{c.H, nqb + 1};
  m.indptr = IndexArray::view(st.indptr, pshape, "<indptr>");
  m.indices = IndexArray::view(st.indices, {static_cast<std::int64_t>(st.indices.size())}, "<indices>");
  if (with_full) {
    build(c.full, st.full_indptr, st.full_indices);
    m.full_indptr = IndexArray::view(st.full_indptr, pshape, "<full_indptr>");
    m.full_indices = IndexArray::view(st.full_indices, {static_cast<std::int64_t>(st.full_indices.size())}, "<full_indices>");
  }
  return m;
}

}  // namespace

TEST_CASE("block_selection_masks: block_topk is exact against brute force, area agrees") {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 150; ++trial) {
    const BlockCase c = random_case(rng, false);
    std::vector<std::int32_t> store;
    const IndexMask m = block_topk_of(c, store);
    const auto masks = block_selection_masks(m, 1 + trial % 3);
    check_exact(c, masks);
    __int128 total = 0;
    for (const auto& rm : masks) total += rm.area_wide();
    CHECK(total == m.area());
  }
}

TEST_CASE("block_selection_masks: bsr with and without full blocks is exact") {
  std::mt19937_64 rng(12);
  for (int trial = 0; trial < 150; ++trial) {
    const bool with_full = trial % 2 == 0;
    const BlockCase c = random_case(rng, with_full);
    BsrStore st;
    const IndexMask m = bsr_of(c, st, with_full);
    check_exact(c, block_selection_masks(m));
    for (int h = 0; h < c.H; ++h) {
      const __int128 want = block_selection_masks(m)[static_cast<std::size_t>(h)].area_wide();
      CHECK(m.area(h) == want);
    }
  }
}

TEST_CASE("block_selection_masks: adjacent blocks and identical rows merge") {
  // S = 16, blocks [1, 4]: every query selects key blocks 0 and 1 (keys [0, 8)),
  // non-causal: one slice for the whole mask.
  std::vector<std::int32_t> v;
  for (int q = 0; q < 16; ++q) v.push_back(1), v.push_back(0);
  IndexMask m;
  m.kind = IndexMaskKind::block_topk;
  m.seqlen = 16;
  m.causal = false;
  m.block_q = 1;
  m.block_k = 4;
  m.indices = IndexArray::view(v, {1, 16, 2}, "<v>");
  auto masks = block_selection_masks(m);
  REQUIRE(masks[0].slices().size() == 1);
  CHECK(masks[0].slices()[0] == Slice{{0, 16}, {0, 8}, MaskType::full});
  // Causal: rows 0-3 select block 0, rows 4-15 blocks 0 and 1: a causal
  // slice per group (query and key ranges ending together) and a full one
  // below the diagonal.
  for (int q = 0; q < 4; ++q) v[static_cast<std::size_t>(2 * q)] = -1;
  m.causal = true;
  masks = block_selection_masks(m);
  REQUIRE(masks[0].slices().size() == 3);
  CHECK(masks[0].slices()[0] == Slice{{0, 4}, {0, 4}, MaskType::causal});
  CHECK(masks[0].slices()[1] == Slice{{4, 8}, {0, 8}, MaskType::causal});
  CHECK(masks[0].slices()[2] == Slice{{8, 16}, {0, 8}, MaskType::full});
  CHECK(masks[0].area() == 10 + 26 + 64);
  m.kind = IndexMaskKind::topk;
  CHECK(error_of([&] { block_selection_masks(m); }) ==
        "block_selection_masks: a topk mask is not a block selection; use count_index_cells");
}
