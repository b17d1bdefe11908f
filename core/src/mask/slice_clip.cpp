#include "cpsched/mask/slice_clip.hpp"

#include <algorithm>
#include <array>

namespace cpsched {

namespace {

// Cuts the band into row intervals on which each side of every row is either
// the rectangle's edge or the diagonal; each interval is one tight slice.
// Row q holds cols [max(k0, q + lo), min(k1 - 1, q + hi)].
int cut(const Band& b, std::array<Slice, 3>& out) {
  if (b.q.empty() || b.k.empty() || b.lo > b.hi) return 0;
  const Token k0 = b.k.begin, k1 = b.k.end;
  // Rows with at least one entry: q + hi >= k0 and q + lo <= k1 - 1.
  const Token r0 = std::max(b.q.begin, k0 - b.hi);
  const Token r1 = std::min(b.q.end, k1 - b.lo);
  if (r0 >= r1) return 0;
  const Token left_diag = k0 - b.lo;   // rows >= this: left end is the diagonal q + lo
  const Token right_edge = k1 - b.hi;  // rows >= this: right end is the edge k1 - 1
  std::array<Token, 4> cuts{r0, std::clamp(left_diag, r0, r1), std::clamp(right_edge, r0, r1), r1};
  std::sort(cuts.begin() + 1, cuts.begin() + 3);
  int n = 0;
  for (int i = 0; i < 3; ++i) {
    const Token u = cuts[static_cast<std::size_t>(i)], v = cuts[static_cast<std::size_t>(i) + 1];
    if (u >= v) continue;
    const bool ld = u >= left_diag;
    const bool rd = u < right_edge;
    Slice s;
    if (!ld && !rd) s = {{u, v}, {k0, k1}, MaskType::full};
    else if (!ld) s = {{u, v}, {k0, v + b.hi}, MaskType::causal};
    else if (!rd) s = {{u, v}, {u + b.lo, k1}, MaskType::inv_causal};
    else s = {{u, v}, {u + b.lo, v + b.hi}, MaskType::bi_causal};
    out[static_cast<std::size_t>(n++)] = s;
  }
  return n;
}

// Area of a tight slice (the shapes `cut` makes: Lk >= Lq for the diagonal types).
Token tight_area(const Slice& s) {
  const Token lq = s.q.size(), lk = s.k.size();
  switch (s.type) {
    case MaskType::full: return lq * lk;
    case MaskType::causal: return lq * (lk - lq + 1) + lq * (lq - 1) / 2;
    case MaskType::inv_causal: return lq * lk - lq * (lq - 1) / 2;
    case MaskType::bi_causal: return lq * (lk - lq + 1);
  }
  return 0;
}

}  // namespace

Band Band::shifted(Token dq, Token dk) const {
  Band o = *this;
  o.q = {q.begin + dq, q.end + dq};
  o.k = {k.begin + dk, k.end + dk};
  if (lo != kNoLo) o.lo = lo + dk - dq;
  if (hi != kNoHi) o.hi = hi + dk - dq;
  return o;
}

Band band_of(const Slice& s) {
  Band b{s.q, s.k, Band::kNoLo, Band::kNoHi};
  if (s.type == MaskType::inv_causal || s.type == MaskType::bi_causal) b.lo = s.k.begin - s.q.begin;
  if (s.type == MaskType::causal || s.type == MaskType::bi_causal) b.hi = s.k.end - s.q.end;
  return b;
}

Band intersect(const Band& a, const Band& b) {
  return Band{a.q.intersect(b.q), a.k.intersect(b.k), std::max(a.lo, b.lo), std::min(a.hi, b.hi)};
}

Band clip(const Band& b, Range q, Range k) {
  return Band{b.q.intersect(q), b.k.intersect(k), b.lo, b.hi};
}

Token band_area(const Band& b) {
  std::array<Slice, 3> parts{};
  const int n = cut(b, parts);
  Token a = 0;
  for (int i = 0; i < n; ++i) a += tight_area(parts[static_cast<std::size_t>(i)]);
  return a;
}

void band_to_slices(const Band& b, std::vector<Slice>& out) {
  std::array<Slice, 3> parts{};
  const int n = cut(b, parts);
  out.insert(out.end(), parts.begin(), parts.begin() + n);
}

std::vector<Slice> clip_slice(const Slice& s, Range q, Range k) {
  std::vector<Slice> out;
  band_to_slices(clip(band_of(s), q, k), out);
  return out;
}

}  // namespace cpsched
