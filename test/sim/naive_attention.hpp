#pragma once
// O(Lq x Lk) double-precision attention over one slice, straight from the
// definitions (slice_contains for the mask), for checking the sim kernel.
// Layout: row-major [rows x heads x dim], lse [rows x heads].
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "cpsched/mask/mask.hpp"

namespace cpsched::sim::test {

struct NaiveOut {
  std::vector<double> o, lse;
};
struct NaiveGrads {
  std::vector<double> dq, dk, dv;
};

inline bool naive_unmasked(MaskType t, Token lq, Token lk, Token i, Token j) {
  return slice_contains(Slice{{0, lq}, {0, lk}, t}, i, j);
}

// q: lq x hq x dim, k/v: lk x hkv x dim.
inline NaiveOut naive_forward(const std::vector<float>& q, const std::vector<float>& k,
                              const std::vector<float>& v, Token lq, Token lk, int hq, int hkv, int dim,
                              MaskType t) {
  NaiveOut r;
  r.o.assign(static_cast<std::size_t>(lq * hq * dim), 0.0);
  r.lse.assign(static_cast<std::size_t>(lq * hq), -std::numeric_limits<double>::infinity());
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  for (int h = 0; h < hq; ++h) {
    const int kh = h / (hq / hkv);
    for (Token i = 0; i < lq; ++i) {
      std::vector<double> s;
      std::vector<Token> cols;
      for (Token j = 0; j < lk; ++j) {
        if (!naive_unmasked(t, lq, lk, i, j)) continue;
        double dot = 0;
        for (int d = 0; d < dim; ++d)
          dot += double(q[static_cast<std::size_t>((i * hq + h) * dim + d)]) *
                 double(k[static_cast<std::size_t>((j * hkv + kh) * dim + d)]);
        s.push_back(dot * scale);
        cols.push_back(j);
      }
      if (s.empty()) continue;
      double mx = s[0];
      for (double x : s) mx = std::max(mx, x);
      double sum = 0;
      for (double x : s) sum += std::exp(x - mx);
      const double lse = mx + std::log(sum);
      r.lse[static_cast<std::size_t>(i * hq + h)] = lse;
      for (std::size_t n = 0; n < s.size(); ++n) {
        const double p = std::exp(s[n] - lse);
        for (int d = 0; d < dim; ++d)
          r.o[static_cast<std::size_t>((i * hq + h) * dim + d)] +=
              p * double(v[static_cast<std::size_t>((cols[n] * hkv + kh) * dim + d)]);
      }
    }
  }
  return r;
}

// Gradients of L = sum(O * dO).
inline NaiveGrads naive_backward(const std::vector<float>& q, const std::vector<float>& k,
                                 const std::vector<float>& v, const std::vector<float>& d_o, Token lq,
                                 Token lk, int hq, int hkv, int dim, MaskType t) {
  const NaiveOut f = naive_forward(q, k, v, lq, lk, hq, hkv, dim, t);
  NaiveGrads g;
  g.dq.assign(q.size(), 0.0);
  g.dk.assign(k.size(), 0.0);
  g.dv.assign(v.size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  for (int h = 0; h < hq; ++h) {
    const int kh = h / (hq / hkv);
    for (Token i = 0; i < lq; ++i) {
      const double lse = f.lse[static_cast<std::size_t>(i * hq + h)];
      if (std::isinf(lse)) continue;
      double delta = 0;
      for (int d = 0; d < dim; ++d)
        delta += f.o[static_cast<std::size_t>((i * hq + h) * dim + d)] *
                 double(d_o[static_cast<std::size_t>((i * hq + h) * dim + d)]);
      for (Token j = 0; j < lk; ++j) {
        if (!naive_unmasked(t, lq, lk, i, j)) continue;
        const std::size_t qi = static_cast<std::size_t>((i * hq + h) * dim);
        const std::size_t kj = static_cast<std::size_t>((j * hkv + kh) * dim);
        double s = 0, dp = 0;
        for (int d = 0; d < dim; ++d) {
          s += double(q[qi + d]) * double(k[kj + d]);
          dp += double(d_o[qi + d]) * double(v[kj + d]);
        }
        const double p = std::exp(s * scale - lse);
        const double ds = p * (dp - delta);
        for (int d = 0; d < dim; ++d) {
          g.dv[kj + d] += p * double(d_o[qi + d]);
          g.dq[qi + d] += scale * ds * double(k[kj + d]);
          g.dk[kj + d] += scale * ds * double(q[qi + d]);
        }
      }
    }
  }
  return g;
}

inline std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> x(n);
  for (float& f : x) f = static_cast<float>(static_cast<double>(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  return x;
}

// max |a - b| / max |b| (b the reference; 1 when b is all zero).
template <class A, class B>
double rel_err(const std::vector<A>& a, const std::vector<B>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - double(b[i])));
    den = std::max(den, std::abs(double(b[i])));
  }
  return num / (den > 0 ? den : 1.0);
}

}  // namespace cpsched::sim::test
