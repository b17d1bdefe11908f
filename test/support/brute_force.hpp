#pragma once
// Brute-force references for tests: O(area) loops over the mask.
#include <cstdint>
#include <random>
#include <vector>

#include "cpsched/mask/mask.hpp"

namespace cpsched::test {

struct BruteRect {
  Token area = 0;
  Range rows{};  // hull of needed rows
  Range cols{};
  std::vector<bool> row_needed, col_needed;
};

inline BruteRect brute_slice(const Slice& s, Range qr, Range kr) {
  BruteRect b;
  b.row_needed.assign(static_cast<std::size_t>(qr.size()), false);
  b.col_needed.assign(static_cast<std::size_t>(kr.size()), false);
  Token r0 = -1, r1 = -1, c0 = -1, c1 = -1;
  for (Token q = qr.begin; q < qr.end; ++q)
    for (Token k = kr.begin; k < kr.end; ++k)
      if (slice_contains(s, q, k)) {
        ++b.area;
        b.row_needed[static_cast<std::size_t>(q - qr.begin)] = true;
        b.col_needed[static_cast<std::size_t>(k - kr.begin)] = true;
        if (r0 < 0 || q < r0) r0 = q;
        r1 = std::max(r1, q + 1);
        if (c0 < 0 || k < c0) c0 = k;
        c1 = std::max(c1, k + 1);
      }
  if (b.area > 0) {
    b.rows = {r0, r1};
    b.cols = {c0, c1};
  }
  return b;
}

inline bool mask_contains(const RangeMask& m, Token q, Token k) {
  for (const Slice& s : m.slices())
    if (slice_contains(s, q, k)) return true;
  return false;
}

// A random non-overlapping mask: documents with random slice types.
inline RangeMask random_document_mask(Token seqlen, std::mt19937_64& rng) {
  std::vector<Slice> slices;
  Token pos = 0;
  const MaskType types[] = {MaskType::full, MaskType::causal, MaskType::inv_causal, MaskType::bi_causal};
  while (pos < seqlen) {
    const Token len = std::min<Token>(seqlen - pos, 1 + static_cast<Token>(rng() % static_cast<std::uint64_t>(seqlen / 3 + 1)));
    slices.push_back({{pos, pos + len}, {pos, pos + len}, types[rng() % 4]});
    pos += len;
  }
  return RangeMask(seqlen, std::move(slices));
}

}  // namespace cpsched::test
