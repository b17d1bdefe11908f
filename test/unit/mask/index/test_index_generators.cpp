// Index-mask generators (dsa, nsa) against their documented properties, and
// make_index_mask on .npy files.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>


#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/io/npy_array.hpp"
#include "npy_files.hpp"
#include "test_helpers.hpp"

using namespace cpsched;
using test::error_of;
namespace fs = std::filesystem;

namespace {

Token doc_start(const std::vector<Token>& lengths, Token i) {
  Token a = 0;
  for (Token n : lengths) {
    if (i < a + n) return a;
    a += n;
  }
  return a;
}

std::vector<std::int32_t> values(const IndexMask& m) { return {m.indices.span().begin(), m.indices.span().end()}; }

// An int32 .npy in a temporary folder.
fs::path write_i4(const std::string& name, const std::vector<std::int32_t>& v, const std::string& shape) {
  static const fs::path dir = test::process_temp_dir("cpsched_gen_test");
  const fs::path p = dir / name;
  test::write_npy_i4(p, v, shape);
  return p;
}

}  // namespace

TEST_CASE("kinds: index kinds apart from the range kinds") {
  CHECK(index_mask_kind_names() == std::vector<std::string>{"topk", "block_topk", "bsr", "dsa", "nsa"});
  for (const std::string& n : index_mask_kind_names()) {
    MaskKind k{};
    REQUIRE(parse_mask_kind(n, k));
    CHECK(is_index_kind(k));
    CHECK(to_string(k) == n);
  }
  for (const std::string& n : mask_kind_names()) {
    MaskKind k{};
    REQUIRE(parse_mask_kind(n, k));
    CHECK_FALSE(is_index_kind(k));
  }
  MaskSpec spec;
  spec.kind = MaskKind::dsa;
  CHECK(error_of([&] { make_mask(spec, 16); }) == "make_mask: kind dsa is an index mask; use make_index_mask");
  spec.kind = MaskKind::causal;
  CHECK(error_of([&] { make_index_mask(spec, 16); }) == "make_index_mask: kind causal is a range mask; use make_mask");
}

TEST_CASE("dsa: causal, inside documents, sinks and local window present, sorted, -1 padded, seeded") {
  MaskSpec spec;
  spec.kind = MaskKind::dsa;
  spec.lengths = {1000, 300, 1700};
  spec.topk = 256;
  spec.sink = 16;
  spec.local = 64;
  spec.kv_heads = 2;
  const Token S = 3000;
  const IndexMask m = make_index_mask(spec, S);
  CHECK(m.kind == IndexMaskKind::topk);
  CHECK(m.indices.shape == std::vector<std::int64_t>{S, 2, 256});
  for (Token i = 0; i < S; ++i)
    for (int h = 0; h < 2; ++h) {
      const std::int32_t* row = m.indices.data + (i * 2 + h) * 256;
      const Token a = doc_start(spec.lengths, i), avail = i - a + 1, want = std::min<Token>(256, avail);
      Token n = 0;
      while (n < 256 && row[n] != -1) ++n;
      REQUIRE(n == want);
      for (Token j = n; j < 256; ++j) REQUIRE(row[j] == -1);
      for (Token j = 0; j < n; ++j) {
        REQUIRE(row[j] >= a);   // inside the document
        REQUIRE(row[j] <= i);   // causal
        if (j > 0) REQUIRE(row[j] > row[j - 1]);  // sorted, distinct
      }
      // Sinks: the document's first tokens; local: the most recent, the query included.
      for (Token x = a; x < std::min(a + 16, i + 1); ++x) REQUIRE(std::binary_search(row, row + n, static_cast<std::int32_t>(x)));
      for (Token x = std::max(a, i - 63); x <= i; ++x) REQUIRE(std::binary_search(row, row + n, static_cast<std::int32_t>(x)));
    }
  // The two heads draw apart; the same seed gives the same indices, another seed others.
  const std::int32_t* r0 = m.indices.data + (2999 * 2 + 0) * 256;
  CHECK_FALSE(std::equal(r0, r0 + 256, r0 + 256));
  CHECK(values(make_index_mask(spec, S)) == values(m));
  spec.seed = 43;
  CHECK(values(make_index_mask(spec, S)) != values(m));
  CHECK(m.area() == [&] {
    __int128 a = 0;
    for (Token i = 0; i < S; ++i) a += 2 * std::min<Token>(256, i - doc_start(spec.lengths, i) + 1);
    return a;
  }());
  spec.topk = 0;
  CHECK(error_of([&] { make_index_mask(spec, S); }) == "dsa: topk must be >= 1, got 0");
}

TEST_CASE("nsa: block selection of initial, local and random earlier blocks inside the document") {
  MaskSpec spec;
  spec.kind = MaskKind::nsa;
  spec.lengths = {900, 100, 3000};
  spec.nsa_block = 32;
  spec.nsa_top = 8;
  const Token S = 4000;
  const IndexMask m = make_index_mask(spec, S);
  CHECK(m.kind == IndexMaskKind::block_topk);
  CHECK(m.block_q == 1);
  CHECK(m.block_k == 32);
  CHECK(m.indices.shape == std::vector<std::int64_t>{1, S, 8});
  for (Token i = 0; i < S; ++i) {
    const std::int32_t* row = m.indices.data + i * 8;
    const Token fb = doc_start(spec.lengths, i) / 32, lb = i / 32, want = std::min<Token>(8, lb - fb + 1);
    Token n = 0;
    while (n < 8 && row[n] != -1) ++n;
    REQUIRE(n == want);
    for (Token j = 0; j < n; ++j) {
      REQUIRE(row[j] >= fb);
      REQUIRE(row[j] <= lb);
      if (j > 0) REQUIRE(row[j] > row[j - 1]);
    }
    REQUIRE(row[0] == fb);                                            // the initial block
    REQUIRE(row[n - 1] == lb);                                        // the query's block
    if (lb > fb) REQUIRE(std::binary_search(row, row + n, static_cast<std::int32_t>(lb - 1)));  // and the one before
  }
  CHECK(values(make_index_mask(spec, S)) == values(m));
  // Defaults: NSA's 64-token blocks, top 16.
  MaskSpec d;
  d.kind = MaskKind::nsa;
  const IndexMask dm = make_index_mask(d, 4096);
  CHECK(dm.block_k == 64);
  CHECK(dm.indices.shape == std::vector<std::int64_t>{1, 4096, 16});
  CHECK(block_selection_masks(dm).size() == 1);
}

TEST_CASE("make_index_mask: .npy files, heads from the file, defaults and errors") {
  if (!npy_supported()) return;
  // topk: S = 4, two heads.
  std::vector<std::int32_t> t{0, -1, 0, -1, 1, 0, -1, 1, 2, -1, 0, 2, 3, 1, 3, -1};
  MaskSpec spec;
  spec.kind = MaskKind::topk;
  spec.indices_file = write_i4("topk.npy", t, "(4, 2, 2)");
  IndexMask m = make_index_mask(spec, 4);
  CHECK(m.kv_heads == 2);
  CHECK(m.area() == 11);
  spec.kv_heads = 1;
  CHECK(error_of([&] { make_index_mask(spec, 4); }) ==
        spec.indices_file.string() + ": shape [4, 2, 2] does not match kv_heads = 1 (expected [4, 1, k])");
  spec.kv_heads = 0;
  t[4] = 3;
  spec.indices_file = write_i4("topk_bad.npy", t, "(4, 2, 2)");
  CHECK(error_of([&] { make_index_mask(spec, 4); }) ==
        spec.indices_file.string() + ": indices[1, 0, 0] = 3 selects a key after query 1 (causal: true)");

  // block_topk defaults to [1, 64]; bsr to [128, 128].
  spec = {};
  spec.kind = MaskKind::block_topk;
  CHECK(error_of([&] { make_index_mask(spec, 4); }) == "block_topk: needs the .npy file 'indices'");
  spec.indices_file = write_i4("bt.npy", {0, 0, 0, 0}, "(1, 4, 1)");
  m = make_index_mask(spec, 4);
  CHECK(m.block_q == 1);
  CHECK(m.block_k == 64);
  CHECK(m.area() == 10);

  spec = {};
  spec.kind = MaskKind::bsr;
  spec.indptr_file = write_i4("indptr.npy", {0, 1, 2}, "(3,)");
  spec.indices_file = write_i4("indices.npy", {0, 1}, "(2,)");
  spec.block_q = spec.block_k = 2;
  m = make_index_mask(spec, 4);
  CHECK(m.kv_heads == 1);
  CHECK(m.area() == 3 + 3);
  spec.full_indptr_file = spec.indptr_file;
  CHECK(error_of([&] { make_index_mask(spec, 4); }) == "bsr: full_indptr and full_indices come together (got only full_indptr)");
  spec.full_indices_file = write_i4("full_indices.npy", {1, 0}, "(2,)");
  CHECK(error_of([&] { make_index_mask(spec, 4); }) ==
        spec.full_indices_file.string() +
            ": full_indices[0] = 1 (head 0, query block 0) selects key block 1 (keys [2, 4)) after query block 0 (queries "
            "[0, 2)) (causal: true)");
}
