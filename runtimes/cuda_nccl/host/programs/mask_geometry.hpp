#pragma once
// O(1) geometry of mask slices, callable on the device (mask ingestion, the
// attention kernels' predicates and loop bounds) and on the host (launch
// parameters). An independent re-implementation of the closed forms of
// core/src/mask.cpp; test_cuda_host_geometry checks that both agree.
//
// Every slice type is a rectangle cut by at most two diagonals: entry (q, k)
// is unmasked iff q in [qa, qb), k in [ka, kb) and lo <= k - q <= hi, where
// causal has hi = ke - qe, inv_causal has lo = kb - qb, bi_causal both, full
// neither (global coordinates, as in cpsched/slice_clip.hpp). Row q then
// holds the cols [max(ka, q + lo), min(kb, q + hi + 1)): both ends grow with
// q, so the count per row is concave and piecewise linear with at most three
// pieces, and every sum or support below is a closed form over those pieces.
#include <cstdint>

#include "hd.hpp"

namespace cpsched::gpu {

using i64 = std::int64_t;

// Matches cpsched::MaskType.
enum MaskCode : std::int32_t { kFull = 0, kCausal = 1, kInvCausal = 2, kBiCausal = 3 };

struct Iv {
  i64 b = 0;
  i64 e = 0;
  CPSCHED_HD i64 size() const { return e > b ? e - b : 0; }
  CPSCHED_HD bool empty() const { return e <= b; }
};

// A slice as plain data (device memory layout of a range mask).
struct DevSlice {
  i64 qb, qe, kb, ke;
  std::int32_t type;
  std::int32_t pad;
};

struct Band2 {
  i64 qa, qb, ka, kb;  // rectangle
  i64 lo, hi;          // k - q bounds, when present
  bool has_lo, has_hi;
};

CPSCHED_HD inline Band2 band_of(i64 qb, i64 qe, i64 kb, i64 ke, std::int32_t type) {
  Band2 b{qb, qe, kb, ke, 0, 0, false, false};
  if (type == kCausal || type == kBiCausal) {
    b.has_hi = true;
    b.hi = ke - qe;
  }
  if (type == kInvCausal || type == kBiCausal) {
    b.has_lo = true;
    b.lo = kb - qb;
  }
  return b;
}

CPSCHED_HD inline Band2 band_of(const DevSlice& s) { return band_of(s.qb, s.qe, s.kb, s.ke, s.type); }

CPSCHED_HD inline Band2 clip(Band2 b, Iv q, Iv k) {
  b.qa = hd_max(b.qa, q.b);
  b.qb = hd_min(b.qb, q.e);
  b.ka = hd_max(b.ka, k.b);
  b.kb = hd_min(b.kb, k.e);
  return b;
}

CPSCHED_HD inline bool band_contains(const Band2& b, i64 q, i64 k) {
  if (q < b.qa || q >= b.qb || k < b.ka || k >= b.kb) return false;
  const i64 d = k - q;
  return (!b.has_lo || d >= b.lo) && (!b.has_hi || d <= b.hi);
}

// Cols of row q (may be empty; q assumed inside the rows).
CPSCHED_HD inline Iv row_cols(const Band2& b, i64 q) {
  return {b.has_lo ? hd_max(b.ka, q + b.lo) : b.ka, b.has_hi ? hd_min(b.kb, q + b.hi + 1) : b.kb};
}

namespace detail {

// count(q) = m * q + c on rows [x, y).
struct Lin {
  i64 x, y;
  i64 m, c;
};

// The (at most three) linear pieces of the per-row count.
CPSCHED_HD inline int count_pieces(const Band2& b, Lin* out) {
  if (b.qa >= b.qb || b.ka >= b.kb) return 0;
  // The upper end stops following the diagonal at xh, the lower end starts at xl.
  i64 cut[2];
  int n = 0;
  if (b.has_hi) cut[n++] = hd_min(hd_max(b.kb - b.hi, b.qa), b.qb);
  if (b.has_lo) cut[n++] = hd_min(hd_max(b.ka - b.lo, b.qa), b.qb);
  if (n == 2 && cut[1] < cut[0]) {
    const i64 t = cut[0];
    cut[0] = cut[1];
    cut[1] = t;
  }
  int k = 0;
  i64 x = b.qa;
  for (int i = 0; i <= n; ++i) {
    const i64 y = i < n ? cut[i] : b.qb;
    if (y <= x) continue;
    const bool hi_diag = b.has_hi && x < b.kb - b.hi;
    const bool lo_diag = b.has_lo && x >= b.ka - b.lo;
    const i64 mh = hi_diag ? 1 : 0, ch = hi_diag ? b.hi + 1 : b.kb;
    const i64 ml = lo_diag ? 1 : 0, cl = lo_diag ? b.lo : b.ka;
    out[k++] = Lin{x, y, mh - ml, ch - cl};
    x = y;
  }
  return k;
}

// Rows of the piece with a positive count.
CPSCHED_HD inline Iv positive(const Lin& p) {
  Iv r{p.x, p.y};
  if (p.m == 0) return p.c > 0 ? r : Iv{0, 0};
  if (p.m > 0) r.b = hd_max(r.b, 1 - p.c);
  else r.e = hd_min(r.e, p.c);
  return r.empty() ? Iv{0, 0} : r;
}

}  // namespace detail

// Unmasked entries of the band.
CPSCHED_HD inline i64 band_area(const Band2& b) {
  detail::Lin p[3];
  const int n = detail::count_pieces(b, p);
  i64 a = 0;
  for (int i = 0; i < n; ++i) {
    const Iv r = detail::positive(p[i]);
    const i64 len = r.size();
    if (len == 0) continue;
    a += p[i].m * ((r.b + r.e - 1) * len / 2) + p[i].c * len;
  }
  return a;
}

// Rows holding at least one entry (one interval: the count is concave).
CPSCHED_HD inline Iv band_rows(const Band2& b) {
  detail::Lin p[3];
  const int n = detail::count_pieces(b, p);
  Iv rows{0, 0};
  for (int i = 0; i < n; ++i) {
    const Iv r = detail::positive(p[i]);
    if (r.empty()) continue;
    if (rows.empty()) rows = r;
    else rows = {hd_min(rows.b, r.b), hd_max(rows.e, r.e)};
  }
  return rows;
}

// Cols holding at least one entry: both ends of a row's cols grow with q and
// non-empty rows are consecutive, so the union is one interval.
CPSCHED_HD inline Iv band_cols(const Band2& b) {
  const Iv rows = band_rows(b);
  if (rows.empty()) return {0, 0};
  return {row_cols(b, rows.b).b, row_cols(b, rows.e - 1).e};
}

// Rows of col k (may be empty): q <= k - lo and q >= k - hi.
CPSCHED_HD inline Iv col_rows(const Band2& b, i64 k) {
  if (k < b.ka || k >= b.kb) return {0, 0};
  return {b.has_hi ? hd_max(b.qa, k - b.hi) : b.qa, b.has_lo ? hd_min(b.qb, k - b.lo + 1) : b.qb};
}

}  // namespace cpsched::gpu
