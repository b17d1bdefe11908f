#include "attention_kernel.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpsched/base/error.hpp"
#include "parallel.hpp"
#include "row_span.hpp"

namespace cpsched::sim {

namespace {

// Tile sizes: a K (and V) tile of kTileK x dim floats is transposed once and
// reused by the kTileQ rows of a q tile, so the score and dP loops run over
// contiguous memory and vectorise.
constexpr Token kTileQ = 32;
constexpr Token kTileK = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Geometry {
  Token lq = 0, lk = 0;
  MaskType type = MaskType::full;
  ColSpan span(Token i) const { return row_span(type, i, lq, lk); }
  // Columns touched by rows [r0, r1): rows are non-empty on one interval
  // and both span ends are monotone, so the hull is first.lo .. last.hi.
  ColSpan hull(Token r0, Token r1) const {
    Token a = r0, b = r1 - 1;
    while (a <= b && span(a).empty()) ++a;
    while (b >= a && span(b).empty()) --b;
    if (a > b) return {};
    return {span(a).lo, span(b).hi};
  }
  // Span of row i clipped to the tile [c0, c1), relative to c0.
  ColSpan in_tile(Token i, Token c0, Token c1) const {
    const ColSpan s = span(i);
    const Token lo = std::max(s.lo, c0), hi = std::min(s.hi, c1);
    return hi > lo ? ColSpan{lo - c0, hi - c0} : ColSpan{};
  }
};

Geometry geometry_of(const Slice& arg) {
  if (arg.q.end < arg.q.begin || arg.k.end < arg.k.begin)
    throw Error("attention kernel: inverted range in arg");
  return {arg.q.size(), arg.k.size(), arg.type};
}

void check_shape(const KernelShape& s) {
  if (s.q_heads <= 0 || s.kv_heads <= 0 || s.dim <= 0 || s.dim_v < 0 || s.q_heads % s.kv_heads != 0 ||
      (s.kv_shared && s.dv() > s.dim))
    throw Error("attention kernel: bad shape (q_heads " + std::to_string(s.q_heads) + ", kv_heads " +
                std::to_string(s.kv_heads) + ", dim " + std::to_string(s.dim) + ", dim_v " + std::to_string(s.dim_v) +
                (s.kv_shared ? ", kv shared" : "") + ")");
}

// out[d * kTileK + j] = rows[c0 + j][d] for j < n (head already applied).
void transpose_tile(CView rows, Token c0, Token n, int dim, std::vector<float>& out) {
  for (Token j = 0; j < n; ++j) {
    const float* r = rows.row(c0 + j);
    for (int d = 0; d < dim; ++d) out[static_cast<std::size_t>(d * kTileK + j)] = r[d];
  }
}

// s[j] = scale * dot(x, tile column j) for j in [lo, hi).
void dot_tile(const float* x, const std::vector<float>& tile, int dim, Token lo, Token hi, float scale,
              float* s) {
  for (Token j = lo; j < hi; ++j) s[j] = 0.0f;
  for (int d = 0; d < dim; ++d) {
    const float xd = x[d];
    const float* col = tile.data() + static_cast<std::ptrdiff_t>(d) * kTileK;
    for (Token j = lo; j < hi; ++j) s[j] += xd * col[j];
  }
  if (scale != 1.0f)
    for (Token j = lo; j < hi; ++j) s[j] *= scale;
}

Token num_tiles(Token n, Token tile) { return (n + tile - 1) / tile; }

}  // namespace

double attention_work(const KernelShape& shape, const Slice& arg) {
  const Slice rel{{0, arg.q.size()}, {0, arg.k.size()}, arg.type};
  return static_cast<double>(slice_area(rel)) * shape.q_heads * (0.5 * (shape.dim + shape.dv()));
}

Partial attention_forward(const KernelShape& shape, CView q, CView k, CView v, const Slice& arg,
                          int threads) {
  check_shape(shape);
  const Geometry g = geometry_of(arg);
  const int H = shape.q_heads, D = shape.dim, DV = shape.dv(), VS = shape.v_head_stride();
  const int ratio = shape.q_heads / shape.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  Partial out;
  out.rows = g.lq;
  out.heads = H;
  out.dim = DV;
  out.o.assign(static_cast<std::size_t>(g.lq * H * DV), 0.0f);
  out.lse.assign(static_cast<std::size_t>(g.lq * H), kNegInf);
  const Token qtiles = num_tiles(g.lq, kTileQ);
  const int nthreads = threads_for_work(attention_work(shape, arg), threads);

  parallel_for(qtiles * H, nthreads, [&](std::int64_t item) {
    const int h = static_cast<int>(item % H);
    const Token r0 = (item / H) * kTileQ, r1 = std::min(g.lq, r0 + kTileQ);
    const int kh = h / ratio;
    const CView qh = q.from(arg.q.begin).at(static_cast<std::int64_t>(h) * D);
    const CView kh_rows = k.from(arg.k.begin).at(static_cast<std::int64_t>(kh) * D);
    const CView vh_rows = v.from(arg.k.begin).at(static_cast<std::int64_t>(kh) * VS);
    std::vector<float> m(static_cast<std::size_t>(kTileQ), kNegInf), l(static_cast<std::size_t>(kTileQ), 0.0f);
    std::vector<float> acc(static_cast<std::size_t>(kTileQ * DV), 0.0f);
    std::vector<float> kt(static_cast<std::size_t>(kTileK * D)), s(static_cast<std::size_t>(kTileK));
    const ColSpan hull = g.hull(r0, r1);
    for (Token c0 = hull.lo; c0 < hull.hi; c0 += kTileK) {
      const Token c1 = std::min(hull.hi, c0 + kTileK);
      transpose_tile(kh_rows, c0, c1 - c0, D, kt);
      for (Token i = r0; i < r1; ++i) {
        const ColSpan sp = g.in_tile(i, c0, c1);
        if (sp.empty()) continue;
        dot_tile(qh.row(i), kt, D, sp.lo, sp.hi, scale, s.data());
        const std::size_t ri = static_cast<std::size_t>(i - r0);
        float mx = m[ri];
        for (Token j = sp.lo; j < sp.hi; ++j) mx = std::max(mx, s[static_cast<std::size_t>(j)]);
        const float alpha = std::exp(m[ri] - mx);  // exp(-inf) = 0 on the first tile
        float* a = acc.data() + ri * static_cast<std::size_t>(DV);
        l[ri] *= alpha;
        for (int d = 0; d < DV; ++d) a[d] *= alpha;
        for (Token j = sp.lo; j < sp.hi; ++j) {
          const float p = std::exp(s[static_cast<std::size_t>(j)] - mx);
          l[ri] += p;
          const float* vj = vh_rows.row(c0 + j);
          for (int d = 0; d < DV; ++d) a[d] += p * vj[d];
        }
        m[ri] = mx;
      }
    }
    for (Token i = r0; i < r1; ++i) {
      const std::size_t ri = static_cast<std::size_t>(i - r0);
      if (l[ri] <= 0.0f) continue;  // empty row: O = 0, lse = -inf
      const std::size_t at = static_cast<std::size_t>(i * H + h);
      out.lse[at] = m[ri] + std::log(l[ri]);
      const float inv = 1.0f / l[ri];
      const float* a = acc.data() + ri * static_cast<std::size_t>(DV);
      float* o = out.o.data() + at * static_cast<std::size_t>(DV);
      for (int d = 0; d < DV; ++d) o[d] = a[d] * inv;
    }
  });
  return out;
}

void attention_backward(const KernelShape& shape, const BackwardInputs& in, const BackwardOutputs& out,
                        const Slice& arg, int threads) {
  check_shape(shape);
  const Geometry g = geometry_of(arg);
  const int H = shape.q_heads, HK = shape.kv_heads, D = shape.dim, ratio = H / HK;
  const int DV = shape.dv(), VS = shape.v_head_stride();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int nthreads = threads_for_work(2.5 * attention_work(shape, arg), threads);
  const CView q = in.q.from(arg.q.begin), o = in.o.from(arg.q.begin), d_o = in.d_o.from(arg.q.begin),
              lse = in.lse.from(arg.q.begin);
  const CView k = in.k.from(arg.k.begin), v = in.v.from(arg.k.begin);
  const MView dq = out.dq.from(arg.q.begin), dk = out.dk.from(arg.k.begin), dv = out.dv.from(arg.k.begin);

  // delta[i * H + h] = rowsum(dO * O): the softmax Jacobian's correction term.
  std::vector<float> delta(static_cast<std::size_t>(g.lq * H), 0.0f);
  for (Token i = 0; i < g.lq; ++i)
    for (int h = 0; h < H; ++h) {
      const float* a = o.row(i) + static_cast<std::ptrdiff_t>(h) * DV;
      const float* b = d_o.row(i) + static_cast<std::ptrdiff_t>(h) * DV;
      float sum = 0.0f;
      for (int d = 0; d < DV; ++d) sum += a[d] * b[d];
      delta[static_cast<std::size_t>(i * H + h)] = sum;
    }

  // Computes P and dS of row i (head h) against tile columns [sp.lo, sp.hi).
  auto row_grads = [&](int h, Token i, const ColSpan& sp, const std::vector<float>& kt,
                       const std::vector<float>& vt, float* p, float* ds) {
    const float row_lse = lse.row(i)[h];
    dot_tile(q.row(i) + static_cast<std::ptrdiff_t>(h) * D, kt, D, sp.lo, sp.hi, scale, p);
    for (Token j = sp.lo; j < sp.hi; ++j) p[j] = std::exp(p[j] - row_lse);
    dot_tile(d_o.row(i) + static_cast<std::ptrdiff_t>(h) * DV, vt, DV, sp.lo, sp.hi, 1.0f, ds);
    const float di = delta[static_cast<std::size_t>(i * H + h)];
    for (Token j = sp.lo; j < sp.hi; ++j) ds[j] = p[j] * (ds[j] - di);
  };
  auto row_alive = [&](int h, Token i) { return lse.row(i)[h] != kNegInf; };

  // Pass A: dQ, one work item per (q head, q tile): each writes its own rows.
  const Token qtiles = num_tiles(g.lq, kTileQ);
  parallel_for(qtiles * H, nthreads, [&](std::int64_t item) {
    const int h = static_cast<int>(item % H);
    const Token r0 = (item / H) * kTileQ, r1 = std::min(g.lq, r0 + kTileQ);
    const std::int64_t koff = static_cast<std::int64_t>(h / ratio) * D, voff = static_cast<std::int64_t>(h / ratio) * VS;
    std::vector<float> kt(static_cast<std::size_t>(kTileK * D)), vt(static_cast<std::size_t>(kTileK * DV));
    std::vector<float> p(static_cast<std::size_t>(kTileK)), ds(p.size());
    std::vector<float> acc(static_cast<std::size_t>(kTileQ * D), 0.0f);
    const ColSpan hull = g.hull(r0, r1);
    for (Token c0 = hull.lo; c0 < hull.hi; c0 += kTileK) {
      const Token c1 = std::min(hull.hi, c0 + kTileK);
      transpose_tile(k.at(koff), c0, c1 - c0, D, kt);
      transpose_tile(v.at(voff), c0, c1 - c0, DV, vt);
      for (Token i = r0; i < r1; ++i) {
        const ColSpan sp = g.in_tile(i, c0, c1);
        if (sp.empty() || !row_alive(h, i)) continue;
        row_grads(h, i, sp, kt, vt, p.data(), ds.data());
        float* a = acc.data() + static_cast<std::size_t>((i - r0) * D);
        for (Token j = sp.lo; j < sp.hi; ++j) {
          const float w = scale * ds[static_cast<std::size_t>(j)];
          const float* kj = k.row(c0 + j) + koff;
          for (int d = 0; d < D; ++d) a[d] += w * kj[d];
        }
      }
    }
    for (Token i = r0; i < r1; ++i) {
      float* dst = dq.row(i) + static_cast<std::ptrdiff_t>(h) * D;
      const float* a = acc.data() + static_cast<std::size_t>((i - r0) * D);
      for (int d = 0; d < D; ++d) dst[d] += a[d];
    }
  });

  // Pass B: dK and dV, one work item per (kv head, k tile): each sums over the
  // q heads of its group and the rows that reach the tile, in a fixed order.
  const Token ktiles = num_tiles(g.lk, kTileK);
  parallel_for(ktiles * HK, nthreads, [&](std::int64_t item) {
    const int kh = static_cast<int>(item % HK);
    const Token c0 = (item / HK) * kTileK, c1 = std::min(g.lk, c0 + kTileK);
    const std::int64_t koff = static_cast<std::int64_t>(kh) * D, voff = static_cast<std::int64_t>(kh) * VS;
    std::vector<float> kt(static_cast<std::size_t>(kTileK * D)), vt(static_cast<std::size_t>(kTileK * DV));
    std::vector<float> p(static_cast<std::size_t>(kTileK)), ds(p.size());
    std::vector<float> dk_acc(kt.size(), 0.0f), dv_acc(vt.size(), 0.0f);
    transpose_tile(k.at(koff), c0, c1 - c0, D, kt);
    transpose_tile(v.at(voff), c0, c1 - c0, DV, vt);
    for (int h = kh * ratio; h < (kh + 1) * ratio; ++h) {
      for (Token i = 0; i < g.lq; ++i) {
        const ColSpan sp = g.in_tile(i, c0, c1);
        if (sp.empty() || !row_alive(h, i)) continue;
        row_grads(h, i, sp, kt, vt, p.data(), ds.data());
        const float* qi = q.row(i) + static_cast<std::ptrdiff_t>(h) * D;
        const float* doi = d_o.row(i) + static_cast<std::ptrdiff_t>(h) * DV;
        for (Token j = sp.lo; j < sp.hi; ++j) {
          const float pj = p[static_cast<std::size_t>(j)], wj = scale * ds[static_cast<std::size_t>(j)];
          float* dvj = dv_acc.data() + static_cast<std::size_t>(j * DV);
          float* dkj = dk_acc.data() + static_cast<std::size_t>(j * D);
          for (int d = 0; d < DV; ++d) dvj[d] += pj * doi[d];
          for (int d = 0; d < D; ++d) dkj[d] += wj * qi[d];
        }
      }
    }
    // Shared latent: dv aliases dk, so both sums land in one gradient row
    // (this item owns the tile's rows, the two loops run in order).
    for (Token j = c0; j < c1; ++j) {
      float* a = dk.row(j) + koff;
      const float* x = dk_acc.data() + static_cast<std::size_t>((j - c0) * D);
      for (int d = 0; d < D; ++d) a[d] += x[d];
      float* b = dv.row(j) + voff;
      const float* y = dv_acc.data() + static_cast<std::size_t>((j - c0) * DV);
      for (int d = 0; d < DV; ++d) b[d] += y[d];
    }
  });
}

}  // namespace cpsched::sim
