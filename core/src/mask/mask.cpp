#include "cpsched/mask/mask.hpp"

#include <algorithm>
#include <array>
#include <limits>
#include <set>
#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "cpsched/base/limits.hpp"

namespace cpsched {

std::string_view to_string(MaskType t) {
  switch (t) {
    case MaskType::full: return "full";
    case MaskType::causal: return "causal";
    case MaskType::inv_causal: return "inv_causal";
    case MaskType::bi_causal: return "bi_causal";
  }
  return "?";
}

std::optional<MaskType> parse_mask_type(std::string_view s) {
  for (MaskType t : {MaskType::full, MaskType::causal, MaskType::inv_causal, MaskType::bi_causal})
    if (s == to_string(t)) return t;
  return std::nullopt;
}

namespace {

// A linear bound slope*q + c with slope 0 or 1 (global coordinates).
struct Lin {
  int slope;
  Token c;
  Token at(Token q) const { return slope * q + c; }
};

// Row q of a slice allows cols [lo(q), hi(q)) intersected with [ca, cb).
struct Band {
  Token ra, rb;  // rows
  Token ca, cb;  // col clamp
  Lin lo, hi;
};

Band make_band(const Slice& s, Range qr, Range kr) {
  const Token d = s.k.size() - s.q.size();
  const Token base = s.k.begin - s.q.begin;  // col of row q's diagonal is q + base
  Band b{std::max(s.q.begin, qr.begin), std::min(s.q.end, qr.end),
         std::max(s.k.begin, kr.begin), std::min(s.k.end, kr.end), {0, s.k.begin}, {0, s.k.end}};
  switch (s.type) {
    case MaskType::full: break;
    case MaskType::causal: b.hi = {1, base + d + 1}; break;
    case MaskType::inv_causal: b.lo = {1, base}; break;
    case MaskType::bi_causal: b.lo = {1, base}; b.hi = {1, base + d + 1}; break;
  }
  return b;
}

// f(q) = min(hi(q), cb) - max(lo(q), ca) is linear between at most two breakpoints.
struct Piece {
  Token x, y;    // rows [x, y)
  int m;         // slope of f on the piece
  Token c;       // f(q) = m*q + c
};

int pieces(const Band& b, std::array<Piece, 3>& out) {
  if (b.ra >= b.rb || b.ca >= b.cb) return 0;
  std::array<Token, 4> cuts{b.ra, b.rb, b.rb, b.rb};
  int n = 1;
  if (b.hi.slope == 1) cuts[n++] = std::clamp(b.cb - b.hi.c, b.ra, b.rb);  // hi(q) >= cb from here
  if (b.lo.slope == 1) cuts[n++] = std::clamp(b.ca - b.lo.c, b.ra, b.rb);  // lo(q) >= ca from here
  if (n == 3 && cuts[2] < cuts[1]) std::swap(cuts[1], cuts[2]);
  cuts[n] = b.rb;
  int k = 0;
  Token x = b.ra;
  for (int i = 1; i <= n; ++i) {
    Token y = cuts[i];
    if (y <= x) continue;
    // Pick the active branch at row x (valid on the whole piece).
    const bool hi_capped = b.hi.slope == 0 ? b.hi.c >= b.cb : b.hi.at(x) >= b.cb;
    const bool lo_capped = b.lo.slope == 0 ? b.lo.c <= b.ca : b.lo.at(x) < b.ca;
    int m = 0;
    Token c = 0;
    if (hi_capped) c += b.cb; else { m += b.hi.slope; c += b.hi.c; }
    if (lo_capped) c -= b.ca; else { m -= b.lo.slope; c -= b.lo.c; }
    out[static_cast<std::size_t>(k++)] = {x, y, m, c};
    x = y;
  }
  return k;
}

// Rows of the piece where f > 0 (an interval).
Range positive_rows(const Piece& p) {
  Range r{p.x, p.y};
  if (p.m == 0) return p.c > 0 ? r : Range{};
  if (p.m > 0) r.begin = std::max(r.begin, 1 - p.c);        // q + c > 0
  else r.end = std::min(r.end, p.c);                         // c - q > 0
  return r.empty() ? Range{} : r;
}

// In 128-bit: with rows near 2^40 the partial products pass 2^63 even when
// the sum is small.
__int128 sum_linear(int m, Token c, Range r) {
  const __int128 n = r.size();
  if (n == 0) return 0;
  return m * ((__int128{r.begin} + r.end - 1) * n / 2) + __int128{c} * n;
}

Range band_rows(const Band& b) {
  std::array<Piece, 3> ps{};
  const int n = pieces(b, ps);
  Range rows{};
  for (int i = 0; i < n; ++i) {
    rows = rows.hull(positive_rows(ps[static_cast<std::size_t>(i)]));
  }
  return rows;
}

}  // namespace

__int128 slice_area_wide(const Slice& s, Range qr, Range kr) {
  const Band b = make_band(s, qr, kr);
  std::array<Piece, 3> ps{};
  const int n = pieces(b, ps);
  __int128 area = 0;
  for (int i = 0; i < n; ++i) {
    const Piece& p = ps[static_cast<std::size_t>(i)];
    area += sum_linear(p.m, p.c, positive_rows(p));
  }
  return area;
}

Token slice_area(const Slice& s, Range qr, Range kr) {
  return checked_int64(slice_area_wide(s, qr, kr), "slice area");
}

Token slice_area(const Slice& s) { return slice_area(s, s.q, s.k); }

Range slice_needed_rows(const Slice& s, Range qr, Range kr) { return band_rows(make_band(s, qr, kr)); }

Range slice_needed_cols(const Slice& s, Range qr, Range kr) {
  const Band b = make_band(s, qr, kr);
  const Range rows = band_rows(b);
  if (rows.empty()) return {};
  // lo and hi never decrease with q, and consecutive non-empty rows touch, so
  // the union of the rows' col intervals is one interval.
  return {std::max(b.lo.at(rows.begin), b.ca), std::min(b.hi.at(rows.end - 1), b.cb)};
}

bool slice_contains(const Slice& s, Token q, Token k) {
  if (!s.q.contains(q) || !s.k.contains(k)) return false;
  const Token i = q - s.q.begin, j = k - s.k.begin, d = s.k.size() - s.q.size();
  switch (s.type) {
    case MaskType::full: return true;
    case MaskType::causal: return j <= i + d;
    case MaskType::inv_causal: return j >= i;
    case MaskType::bi_causal: return i <= j && j <= i + d;
  }
  return false;
}

namespace {

// Whether two slices share an unmasked entry. f(q) = min(his) - max(los) is
// concave, so its maximum over integer rows lies at an end or next to a
// crossing of two of its linear terms.
bool slices_overlap(const Slice& a, const Slice& b) {
  const Band x = make_band(a, b.q, b.k);
  const Band y = make_band(b, a.q, a.k);
  const Token ra = std::max(x.ra, y.ra), rb = std::min(x.rb, y.rb);
  const Token ca = std::max(x.ca, y.ca), cb = std::min(x.cb, y.cb);
  if (ra >= rb || ca >= cb) return false;
  const std::array<Lin, 3> his{x.hi, y.hi, Lin{0, cb}};
  const std::array<Lin, 3> los{x.lo, y.lo, Lin{0, ca}};
  auto f = [&](Token q) {
    Token h = his[0].at(q), l = los[0].at(q);
    for (const Lin& v : his) h = std::min(h, v.at(q));
    for (const Lin& v : los) l = std::max(l, v.at(q));
    return h - l;
  };
  // Ends, and rows next to each crossing (3 pairs x 3 rows, twice): no heap.
  std::array<Token, 2 + 18> cand{ra, rb - 1};
  std::size_t n = 2;
  auto crossings = [&](const std::array<Lin, 3>& ls) {
    for (std::size_t i = 0; i < ls.size(); ++i)
      for (std::size_t j = i + 1; j < ls.size(); ++j)
        if (ls[i].slope != ls[j].slope) {
          const Token q = (ls[j].c - ls[i].c) / (ls[i].slope - ls[j].slope);
          for (Token t : {q - 1, q, q + 1}) cand[n++] = t;
        }
  };
  crossings(his);
  crossings(los);
  for (std::size_t i = 0; i < n; ++i)
    if (cand[i] >= ra && cand[i] < rb && f(cand[i]) > 0) return true;
  return false;
}

}  // namespace

RangeMask::RangeMask(Token seqlen, std::vector<Slice> slices)
    : seqlen_(seqlen), slices_(std::move(slices)) {}

__int128 RangeMask::area_wide() const {
  __int128 a = 0;
  for (const Slice& s : slices_) a += slice_area_wide(s, s.q, s.k);
  return a;
}

Token RangeMask::area() const { return checked_int64(area_wide(), "mask area"); }

void RangeMask::validate() const {
  if (seqlen_ <= 0) throw Error(fmt::format("mask: sequence length must be positive, got {}", seqlen_));
  auto fmt_range = [](Range r) { return fmt::format("[{}, {})", r.begin, r.end); };
  for (std::size_t i = 0; i < slices_.size(); ++i) {
    const Slice& s = slices_[i];
    for (auto [name, r] : {std::pair{"q", s.q}, std::pair{"k", s.k}}) {
      if (r.end <= r.begin)
        throw Error(fmt::format("mask slice {}: {} range {} is empty", i, name, fmt_range(r)));
      if (r.begin < 0 || r.end > seqlen_)
        throw Error(fmt::format("mask slice {}: {} range {} is outside the sequence [0, {})", i, name,
                                fmt_range(r), seqlen_));
    }
  }
  // Shamos-Hoey sweep over rows. Along a slice's non-empty rows both ends of
  // its col interval advance by 0 or 1 per row, so slices that do not
  // overlap keep their left-to-right order for as long as both are open: an
  // ordered set keyed by the col interval at the current row stays valid, and
  // the first overlap is between two slices that are neighbours in it at an
  // insertion or a removal. Each neighbour pair gets the exact test over all
  // its rows. O(n log n).
  struct Open {
    Range rows;  // non-empty rows
    Band band;
  };
  std::vector<Open> open(slices_.size());
  // (row, slice) keys sorted in place: no indirection in the comparisons.
  std::vector<std::pair<Token, std::size_t>> starts, ends;
  starts.reserve(slices_.size());
  ends.reserve(slices_.size());
  for (std::size_t i = 0; i < slices_.size(); ++i) {
    const Slice& s = slices_[i];
    open[i].band = make_band(s, s.q, s.k);
    open[i].rows = band_rows(open[i].band);
    if (open[i].rows.empty()) continue;  // an empty slice overlaps nothing
    starts.emplace_back(open[i].rows.begin, i);
    ends.emplace_back(open[i].rows.end, i);
  }
  // Slices come mostly in order (generators emit them so): skip sorted input.
  if (!std::is_sorted(starts.begin(), starts.end())) std::sort(starts.begin(), starts.end());
  if (!std::is_sorted(ends.begin(), ends.end())) std::sort(ends.begin(), ends.end());
  Token row = 0;
  // Left end of the col interval at `row` (the rows are open, so it is non-empty).
  auto left = [&](std::size_t i) { return std::max(open[i].band.lo.at(row), open[i].band.ca); };
  auto before = [&](std::size_t a, std::size_t b) {
    const Token la = left(a), lb = left(b);
    return la != lb ? la < lb : a < b;
  };
  std::set<std::size_t, decltype(before)> active(before);
  std::vector<std::set<std::size_t, decltype(before)>::iterator> where(slices_.size(), active.end());
  auto test = [&](std::size_t x, std::size_t y) {
    if (slices_overlap(slices_[x], slices_[y])) {
      const std::size_t a = std::min(x, y), b = std::max(x, y);
      throw Error(fmt::format("mask slices {} and {} overlap: slice {} (q {}, k {}, {}) and slice {} (q {}, k {}, {}) "
                              "share unmasked entries",
                              a, b, a, fmt_range(slices_[a].q), fmt_range(slices_[a].k), to_string(slices_[a].type),
                              b, fmt_range(slices_[b].q), fmt_range(slices_[b].k), to_string(slices_[b].type)));
    }
  };
  std::size_t e = 0;
  auto close_until = [&](Token r) {
    for (; e < ends.size() && ends[e].first <= r; ++e) {
      auto it = where[ends[e].second];
      auto next = active.erase(it);
      if (next != active.begin() && next != active.end()) test(*std::prev(next), *next);
    }
  };
  for (const auto& [first_row, idx] : starts) {
    close_until(first_row);
    row = first_row;
    const auto it = active.insert(idx).first;
    where[idx] = it;
    if (it != active.begin()) test(*std::prev(it), idx);
    if (std::next(it) != active.end()) test(idx, *std::next(it));
  }
  // Removals after the last insertion still make new neighbours.
  close_until(std::numeric_limits<Token>::max());
}

}  // namespace cpsched
