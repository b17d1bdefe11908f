#pragma once
// Exact cutting of mask slices. A slice clipped to a rectangle is in general
// not a slice of the same type over the clipped rectangle (a causal slice's
// diagonal is anchored at its own bottom-right corner), so clipping re-expresses
// the entries as up to three slices, each of one of the four types.
//
// Every slice type is a rectangle intersected with a diagonal band: entry
// (q, k) is unmasked iff lo <= k - q <= hi, where (global coordinates)
//   full        lo = -inf,               hi = +inf
//   causal      lo = -inf,               hi = k.end - q.end
//   inv_causal  lo = k.begin - q.begin,  hi = +inf
//   bi_causal   lo = k.begin - q.begin,  hi = k.end - q.end
// Bands intersect into bands, so clipping composes exactly.
#include <limits>
#include <vector>

#include "cpsched/mask/mask.hpp"

namespace cpsched {

struct Band {
  static constexpr Token kNoLo = std::numeric_limits<Token>::min() / 4;  // no lower diagonal
  static constexpr Token kNoHi = std::numeric_limits<Token>::max() / 4;  // no upper diagonal
  Range q;
  Range k;
  Token lo = kNoLo;
  Token hi = kNoHi;

  bool contains(Token qt, Token kt) const {
    return q.contains(qt) && k.contains(kt) && kt - qt >= lo && kt - qt <= hi;
  }
  // Same entries with the rows moved by dq and the cols by dk (a buffer mapping).
  Band shifted(Token dq, Token dk) const;
  friend bool operator==(const Band&, const Band&) = default;
};

Band band_of(const Slice& s);
Band intersect(const Band& a, const Band& b);
Band clip(const Band& b, Range q, Range k);

// Unmasked entries of the band, O(1).
Token band_area(const Band& b);

// The band's entries as disjoint "tight" slices (every row and col of a
// piece holds an entry), rows increasing; appends at most three slices.
void band_to_slices(const Band& b, std::vector<Slice>& out);

// The entries of `s` inside q x k as slices (at most three).
std::vector<Slice> clip_slice(const Slice& s, Range q, Range k);

}  // namespace cpsched
