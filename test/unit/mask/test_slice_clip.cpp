// Exact clipping of mask slices to rectangles (slice_clip.hpp), against brute force.
#include <doctest/doctest.h>

#include <random>

#include "cpsched/mask/slice_clip.hpp"

using namespace cpsched;

namespace {

const MaskType kTypes[] = {MaskType::full, MaskType::causal, MaskType::inv_causal, MaskType::bi_causal};

// Every piece is tight (each of its rows and cols holds an entry), pieces are
// disjoint, and together they hold exactly the entries of s inside q x k.
void check_clip(const Slice& s, Range q, Range k) {
  const std::vector<Slice> parts = clip_slice(s, q, k);
  CHECK(parts.size() <= 3);
  Token brute_area = 0;
  for (Token i = q.begin; i < q.end; ++i)
    for (Token j = k.begin; j < k.end; ++j) {
      const bool want = slice_contains(s, i, j);
      brute_area += want;
      int hits = 0;
      for (const Slice& p : parts) hits += slice_contains(p, i, j);
      REQUIRE_MESSAGE(hits == (want ? 1 : 0), "entry (", i, ", ", j, ") of slice q [", s.q.begin, ", ", s.q.end,
                      ") k [", s.k.begin, ", ", s.k.end, ") type ", to_string(s.type));
    }
  Token sum = 0;
  for (const Slice& p : parts) {
    sum += slice_area(p);
    CHECK(slice_needed_rows(p, p.q, p.k) == p.q);
    CHECK(slice_needed_cols(p, p.q, p.k) == p.k);
  }
  CHECK(sum == brute_area);
  CHECK(band_area(clip(band_of(s), q, k)) == brute_area);
  CHECK(band_area(clip(band_of(s), q, k)) == slice_area(s, q, k));
}

}  // namespace

TEST_CASE("a causal slice clipped to a rectangle is cut into a causal and a full piece") {
  // Causal 8 x 8 on the diagonal; rows [4, 8) x cols [0, 6): rows 4, 5 are
  // staircase (cols up to the diagonal), rows 6, 7 are full.
  const Slice s{{0, 8}, {0, 8}, MaskType::causal};
  const std::vector<Slice> parts = clip_slice(s, {4, 8}, {0, 6});
  REQUIRE(parts.size() == 2);
  CHECK(parts[0] == Slice{{4, 6}, {0, 6}, MaskType::causal});
  CHECK(parts[1] == Slice{{6, 8}, {0, 6}, MaskType::full});
}

TEST_CASE("a band clipped on both sides gives full, bi_causal and inv_causal pieces as needed") {
  const Slice s{{0, 10}, {0, 14}, MaskType::bi_causal};  // j - i in [0, 4]
  check_clip(s, {0, 10}, {2, 9});
  const std::vector<Slice> whole = clip_slice(s, s.q, s.k);
  REQUIRE(whole.size() == 1);
  CHECK(whole[0] == s);
}

TEST_CASE("clip_slice is exact for every type, shape and rectangle (brute force)") {
  std::mt19937_64 rng(7);
  for (int it = 0; it < 3000; ++it) {
    const Token q0 = static_cast<Token>(rng() % 8), k0 = static_cast<Token>(rng() % 8);
    const Token lq = 1 + static_cast<Token>(rng() % 12), lk = 1 + static_cast<Token>(rng() % 12);
    const Slice s{{q0, q0 + lq}, {k0, k0 + lk}, kTypes[rng() % 4]};
    const Token a = static_cast<Token>(rng() % 22), b = static_cast<Token>(rng() % 22);
    const Token c = static_cast<Token>(rng() % 22), d = static_cast<Token>(rng() % 22);
    check_clip(s, {std::min(a, b), std::max(a, b)}, {std::min(c, d), std::max(c, d)});
  }
}

TEST_CASE("bands keep their entries when shifted and intersect exactly") {
  std::mt19937_64 rng(11);
  for (int it = 0; it < 500; ++it) {
    const Slice s{{static_cast<Token>(rng() % 5), 6 + static_cast<Token>(rng() % 6)},
                  {static_cast<Token>(rng() % 5), 6 + static_cast<Token>(rng() % 6)}, kTypes[rng() % 4]};
    const Slice t{{static_cast<Token>(rng() % 5), 6 + static_cast<Token>(rng() % 6)},
                  {static_cast<Token>(rng() % 5), 6 + static_cast<Token>(rng() % 6)}, kTypes[rng() % 4]};
    const Token dq = static_cast<Token>(rng() % 20) - 10, dk = static_cast<Token>(rng() % 20) - 10;
    const Band b = band_of(s), sh = b.shifted(dq, dk), x = intersect(b, band_of(t));
    Token both = 0;
    for (Token i = 0; i < 12; ++i)
      for (Token j = 0; j < 12; ++j) {
        CHECK(b.contains(i, j) == slice_contains(s, i, j));
        CHECK(sh.contains(i + dq, j + dk) == b.contains(i, j));
        both += slice_contains(s, i, j) && slice_contains(t, i, j);
      }
    CHECK(band_area(x) == both);
    CHECK(band_area(sh) == band_area(b));
  }
}
