#pragma once
// The unmasked columns of one row of a slice (docs/design.md#masks). Every slice type
// leaves each row one contiguous interval of columns, and both ends never
// decrease with the row, which is what lets the kernel skip whole tiles.
#include <algorithm>

#include "cpsched/mask/mask.hpp"

namespace cpsched::sim {

struct ColSpan {
  Token lo = 0;  // first unmasked column (relative to the slice's k start)
  Token hi = 0;  // one past the last; lo == hi: the row is empty
  bool empty() const { return hi <= lo; }
};

// Row i (relative, 0 <= i < lq) of a slice of type t with lq rows and lk cols;
// same entries as cpsched::slice_contains.
inline ColSpan row_span(MaskType t, Token i, Token lq, Token lk) {
  const Token d = lk - lq;
  Token lo = 0, hi = lk;
  switch (t) {
    case MaskType::full: break;
    case MaskType::causal: hi = std::min(lk, i + d + 1); break;
    case MaskType::inv_causal: lo = i; break;
    case MaskType::bi_causal: lo = i; hi = std::min(lk, i + d + 1); break;
  }
  lo = std::max<Token>(lo, 0);
  return {lo, std::max(hi, lo)};
}

}  // namespace cpsched::sim
