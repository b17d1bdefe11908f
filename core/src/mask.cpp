#include "cpsched/mask.hpp"

#include <algorithm>
#include <array>
#include <fmt/format.h>

#include "cpsched/error.hpp"

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

Token sum_linear(int m, Token c, Range r) {
  const Token n = r.size();
  if (n == 0) return 0;
  return m * ((r.begin + r.end - 1) * n / 2) + c * n;
}

Range band_rows(const Band& b) {
  std::array<Piece, 3> ps{};
  const int n = pieces(b, ps);
  Range rows{};
  for (int i = 0; i < n; ++i) {
    Range r = positive_rows(ps[static_cast<std::size_t>(i)]);
    if (r.empty()) continue;
    if (rows.empty()) rows = r;
    else rows = {std::min(rows.begin, r.begin), std::max(rows.end, r.end)};
  }
  return rows;
}

}  // namespace

Token slice_area(const Slice& s, Range qr, Range kr) {
  const Band b = make_band(s, qr, kr);
  std::array<Piece, 3> ps{};
  const int n = pieces(b, ps);
  Token area = 0;
  for (int i = 0; i < n; ++i) {
    const Piece& p = ps[static_cast<std::size_t>(i)];
    area += sum_linear(p.m, p.c, positive_rows(p));
  }
  return area;
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
  std::vector<Token> cand{ra, rb - 1};
  auto crossings = [&](const std::array<Lin, 3>& ls) {
    for (std::size_t i = 0; i < ls.size(); ++i)
      for (std::size_t j = i + 1; j < ls.size(); ++j)
        if (ls[i].slope != ls[j].slope) {
          const Token q = (ls[j].c - ls[i].c) / (ls[i].slope - ls[j].slope);
          for (Token t : {q - 1, q, q + 1}) cand.push_back(t);
        }
  };
  crossings(his);
  crossings(los);
  for (Token q : cand)
    if (q >= ra && q < rb && f(q) > 0) return true;
  return false;
}

}  // namespace

RangeMask::RangeMask(Token seqlen, std::vector<Slice> slices)
    : seqlen_(seqlen), slices_(std::move(slices)) {}

Token RangeMask::area() const {
  Token a = 0;
  for (const Slice& s : slices_) a += slice_area(s);
  return a;
}

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
  // Sweep over slices by q start; compare only with slices whose rows are still open.
  std::vector<std::size_t> order(slices_.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::pair{slices_[a].q.begin, a} < std::pair{slices_[b].q.begin, b};
  });
  std::vector<std::size_t> open;
  for (std::size_t idx : order) {
    const Slice& s = slices_[idx];
    std::erase_if(open, [&](std::size_t o) { return slices_[o].q.end <= s.q.begin; });
    for (std::size_t o : open) {
      const Slice& t = slices_[o];
      if (t.k.intersect(s.k).empty()) continue;
      if (slices_overlap(s, t)) {
        const std::size_t a = std::min(o, idx), b = std::max(o, idx);
        throw Error(fmt::format("mask slices {} and {} overlap: slice {} (q {}, k {}, {}) and slice {} (q {}, k {}, {}) "
                                "share unmasked entries",
                                a, b, a, fmt_range(slices_[a].q), fmt_range(slices_[a].k), to_string(slices_[a].type),
                                b, fmt_range(slices_[b].q), fmt_range(slices_[b].k), to_string(slices_[b].type)));
      }
    }
    open.push_back(idx);
  }
}

}  // namespace cpsched
