// Device-side counting of token top-k indices (host/programs/topk_count.hpp), run by
// its CPU twin (the very programs the GPU runs): the cells, areas, needed
// rows and cols equal core's count_index_cells on random masks (P 2..8,
// H_kv 1 and 2, per head or merged, uneven blocks that cut bitmap words) and
// on the dsa generator; bad entries are reported as IndexMask::validate does.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "host/programs/topk_count.hpp"
#include "index_cell_checks.hpp"
#include "random_index_masks.hpp"
#include "test_helpers.hpp"

using namespace cpsched;
namespace g = cpsched::gpu;

namespace {

// `n` blocks tiling [0, S) at random cut points (not word aligned).
std::vector<Range> random_blocks(Token S, int n, std::mt19937_64& rng) {
  std::vector<Token> cuts;
  while (static_cast<int>(cuts.size()) < n - 1) {
    const Token c = 1 + static_cast<Token>(rng() % static_cast<std::uint64_t>(S - 1));
    if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
  }
  std::sort(cuts.begin(), cuts.end());
  std::vector<Range> b;
  Token at = 0;
  for (Token c : cuts) {
    b.push_back({at, c});
    at = c;
  }
  b.push_back({at, S});
  return b;
}

g::TopkDims dims_of(const IndexMask& m, bool per_head) {
  return g::TopkDims{m.seqlen, m.kv_heads, static_cast<int>(m.indices.shape[2]), m.causal, per_head};
}

void expect_same(const IndexMask& m, const std::vector<Range>& blocks, bool per_head) {
  const std::vector<IndexCell> want = count_index_cells(m, blocks, IndexCountOptions{per_head, 2});
  test::check_same_cells(g::count_topk_on_host(m.indices.span(), dims_of(m, per_head), blocks, "<random>"), want);
}

}  // namespace

TEST_CASE("runs of set bits: across words, at the range's ends, whole words skipped") {
  std::vector<std::uint32_t> bits(4, 0);
  auto set = [&](int b, int e) {
    for (int x = b; x < e; ++x) bits[static_cast<std::size_t>(x / 32)] |= 1u << (x % 32);
  };
  set(3, 5);
  set(30, 70);
  set(96, 128);
  std::vector<std::pair<g::i64, g::i64>> runs;
  auto collect = [&](g::i64 lo, g::i64 hi) {
    runs.clear();
    g::for_each_run(bits.data(), lo, hi, [&](g::i64 b, g::i64 e) { runs.emplace_back(b, e); });
    return runs;
  };
  using V = std::vector<std::pair<g::i64, g::i64>>;
  CHECK(collect(0, 128) == V{{3, 5}, {30, 70}, {96, 128}});
  CHECK(collect(4, 100) == V{{4, 5}, {30, 70}, {96, 100}});
  CHECK(collect(5, 30).empty());
  CHECK(collect(40, 41) == V{{40, 41}});
  CHECK(collect(70, 96).empty());
  CHECK(collect(127, 128) == V{{127, 128}});
}

TEST_CASE("the CPU twin of the top-k counting programs equals count_index_cells on random masks") {
  std::mt19937_64 rng(1234);
  for (int P = 2; P <= 8; ++P)
    for (int H : {1, 2}) {
      const Token S = 40 * P + static_cast<Token>(rng() % 97);
      const auto m = test::random_topk(S, H, 1 + static_cast<int>(rng() % 9), rng);
      // Sharding-like blocks (2P of them, uneven) and a few coarse ones.
      for (int nb : {2 * P, P}) {
        const std::vector<Range> blocks = random_blocks(S, nb, rng);
        CAPTURE(P);
        CAPTURE(H);
        CAPTURE(nb);
        expect_same(*m, blocks, true);
        if (H == 2) expect_same(*m, blocks, false);
      }
    }
}

TEST_CASE("the CPU twin equals count_index_cells on dsa selections and without causality") {
  MaskSpec spec;
  spec.kind = MaskKind::dsa;
  spec.lengths = {700, 300, 1048};
  spec.topk = 64;
  spec.sink = 8;
  spec.local = 16;
  spec.kv_heads = 2;
  const IndexMask m = make_index_mask(spec, 2048);
  std::mt19937_64 rng(5);
  expect_same(m, random_blocks(2048, 8, rng), true);
  expect_same(m, random_blocks(2048, 13, rng), false);
  IndexMask open = m;
  open.causal = false;
  expect_same(open, random_blocks(2048, 4, rng), true);
}

TEST_CASE("bad entries: the first one in index order, named as IndexMask::validate names it") {
  std::mt19937_64 rng(77);
  auto base = test::random_topk(90, 2, 5, rng);
  auto data = std::make_shared<std::vector<std::int32_t>>(base->indices.span().begin(), base->indices.span().end());
  auto with = [&](std::size_t at, std::int32_t v) {
    auto d = std::make_shared<std::vector<std::int32_t>>(*data);
    (*d)[at] = v;
    IndexMask m = *base;
    m.indices = IndexArray::view(*d, {90, 2, 5}, "sel.npy");
    m.indices.owner = d;
    return m;
  };
  const std::vector<Range> blocks = random_blocks(90, 6, rng);
  auto ours = [&](const IndexMask& m) {
    return test::error_of([&] { g::count_topk_on_host(m.indices.span(), dims_of(m, true), blocks, "sel.npy"); });
  };
  auto core = [&](const IndexMask& m) { return test::error_of([&] { count_index_cells(m, blocks); }); };
  // Row (i, h) = (40, 1), entry 3: flat (40 * 2 + 1) * 5 + 3.
  const IndexMask outside = with(408, 90);
  CHECK(ours(outside) == "sel.npy: indices[40, 1, 3] = 90 is outside [0, 90)");
  CHECK(ours(outside) == core(outside));
  const IndexMask negative = with(408, -7);
  CHECK(ours(negative) == "sel.npy: indices[40, 1, 3] = -7 is outside [0, 90)");
  const IndexMask future = with(408, 41);
  CHECK(ours(future) == "sel.npy: indices[40, 1, 3] = 41 selects a key after query 40 (causal: true)");
  CHECK(ours(future) == core(future));
  // Two bad entries: the first in index order wins, whatever the thread order.
  auto d2 = std::make_shared<std::vector<std::int32_t>>(*data);
  (*d2)[700] = 95;
  (*d2)[12] = 500;
  IndexMask two = *base;
  two.indices = IndexArray::view(*d2, {90, 2, 5}, "sel.npy");
  two.indices.owner = d2;
  CHECK(ours(two) == "sel.npy: indices[1, 0, 2] = 500 is outside [0, 90)");
  CHECK(ours(two) == core(two));

  CHECK(test::error_of([&] { g::count_topk_on_host(base->indices.span(), dims_of(*base, true), {{0, 50}, {60, 90}}, "x"); }) ==
        "top-k counting: block 1 [60, 90) does not follow the previous one");
  CHECK(test::error_of([&] { g::count_topk_on_host(base->indices.span(), dims_of(*base, true), {{0, 50}}, "x"); }) ==
        "top-k counting: the 1 blocks do not tile [0, 90)");
  CHECK(test::error_of([&] {
          g::count_topk_on_host(base->indices.span().first(10), dims_of(*base, true), blocks, "x");
        }) == "x: 10 indices for shape [90, 2, 5]");
}
