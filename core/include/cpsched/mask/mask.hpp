#pragma once
// Range masks: the attention mask as a list of (q_range, k_range, type) slices
// over one sequence of S tokens (docs/design.md#masks). Inside a slice, with relative
// positions i (query) and j (key) and d = Lk - Lq:
//   full        all (i, j)
//   causal      j <= i + d          (bottom-right aligned)
//   inv_causal  j >= i              (top-left aligned)
//   bi_causal   i <= j <= i + d     (band; empty when Lq > Lk)
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cpsched/base/range.hpp"

namespace cpsched {

enum class MaskType : int { full = 0, causal = 1, inv_causal = 2, bi_causal = 3 };

std::string_view to_string(MaskType t);
std::optional<MaskType> parse_mask_type(std::string_view s);

struct Slice {
  Range q;
  Range k;
  MaskType type = MaskType::full;
  friend bool operator==(const Slice&, const Slice&) = default;
};

// Unmasked entries of `s` inside the rectangle q_rect x k_rect (global token
// coordinates), and the query rows / key columns that hold at least one of
// them. All O(1): closed forms over the slice's row intervals.
Token slice_area(const Slice& s, Range q_rect, Range k_rect);
Token slice_area(const Slice& s);
// The same in 128-bit, for any slice inside [0, 2^62): Token slice_area()
// throws when the area does not fit 64 bits (outside cpsched/limits.hpp).
__int128 slice_area_wide(const Slice& s, Range q_rect, Range k_rect);
Range slice_needed_rows(const Slice& s, Range q_rect, Range k_rect);
Range slice_needed_cols(const Slice& s, Range q_rect, Range k_rect);

// Brute-force reference of the above, for tests only (O(area)).
bool slice_contains(const Slice& s, Token q, Token k);

class RangeMask {
 public:
  RangeMask() = default;
  RangeMask(Token seqlen, std::vector<Slice> slices);

  Token seqlen() const { return seqlen_; }
  const std::vector<Slice>& slices() const { return slices_; }
  Token area() const;  // total unmasked entries; throws when over 2^63 - 1
  __int128 area_wide() const;

  // Throws cpsched::Error naming the offending slice(s) by index: a slice
  // outside [0, S), an empty/inverted range, or two slices that overlap in
  // the (q, k) plane.
  void validate() const;

 private:
  Token seqlen_ = 0;
  std::vector<Slice> slices_;
};

}  // namespace cpsched
