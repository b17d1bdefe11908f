#pragma once
// O(Lq x Lk) double-precision attention with MLA head geometry, straight
// from the definitions, for checking the sim kernel: Q and K rows of d_qk
// dims, V, O and dO rows of d_v. With a shared latent V is the first d_v dims
// of K's rows (v is ignored) and the gradient of the latent is dK + dV
// (dV added into its first d_v dims); dv stays empty.
// Layout: row-major [rows x heads x dim], lse [rows x heads].
#include <cmath>
#include <limits>
#include <vector>

#include "cpsched/mask/mask.hpp"

namespace cpsched::sim::test {

struct MlaShape {
  int hq = 1, hkv = 1, dqk = 1, dv = 1;
  bool shared = false;
  int v_stride() const { return shared ? dqk : dv; }  // floats between kv heads of V
  int v_row() const { return hkv * v_stride(); }       // floats per token row of V
};

struct MlaOut {
  std::vector<double> o, lse, dq, dk, dv;
};

// Forward and backward (of L = sum(O * dO)) over one slice of type t.
inline MlaOut naive_mla(const MlaShape& s, const std::vector<float>& q, const std::vector<float>& k,
                        const std::vector<float>& v_in, const std::vector<float>& d_o, Token lq, Token lk,
                        MaskType t) {
  const std::vector<float>& v = s.shared ? k : v_in;
  const int ratio = s.hq / s.hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.dqk));
  MlaOut r;
  r.o.assign(static_cast<std::size_t>(lq * s.hq * s.dv), 0.0);
  r.lse.assign(static_cast<std::size_t>(lq * s.hq), -std::numeric_limits<double>::infinity());
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  if (!s.shared) r.dv.assign(v.size(), 0.0);
  std::vector<double>& dv = s.shared ? r.dk : r.dv;
  auto unmasked = [&](Token i, Token j) { return slice_contains(Slice{{0, lq}, {0, lk}, t}, i, j); };
  auto qat = [&](Token i, int h, int d) { return static_cast<std::size_t>((i * s.hq + h) * s.dqk + d); };
  auto oat = [&](Token i, int h, int d) { return static_cast<std::size_t>((i * s.hq + h) * s.dv + d); };
  auto kat = [&](Token j, int kh, int d) { return static_cast<std::size_t>((j * s.hkv + kh) * s.dqk + d); };
  auto vat = [&](Token j, int kh, int d) {
    return static_cast<std::size_t>(j * s.v_row() + kh * s.v_stride() + d);
  };
  auto score = [&](Token i, int h, Token j) {
    double dot = 0;
    for (int d = 0; d < s.dqk; ++d) dot += double(q[qat(i, h, d)]) * double(k[kat(j, h / ratio, d)]);
    return dot * scale;
  };
  for (int h = 0; h < s.hq; ++h) {
    const int kh = h / ratio;
    for (Token i = 0; i < lq; ++i) {
      double mx = -std::numeric_limits<double>::infinity();
      for (Token j = 0; j < lk; ++j)
        if (unmasked(i, j)) mx = std::max(mx, score(i, h, j));
      if (std::isinf(mx)) continue;
      double sum = 0;
      for (Token j = 0; j < lk; ++j)
        if (unmasked(i, j)) sum += std::exp(score(i, h, j) - mx);
      const double lse = mx + std::log(sum);
      r.lse[static_cast<std::size_t>(i * s.hq + h)] = lse;
      for (Token j = 0; j < lk; ++j) {
        if (!unmasked(i, j)) continue;
        const double p = std::exp(score(i, h, j) - lse);
        for (int d = 0; d < s.dv; ++d) r.o[oat(i, h, d)] += p * double(v[vat(j, kh, d)]);
      }
      double delta = 0;
      for (int d = 0; d < s.dv; ++d) delta += r.o[oat(i, h, d)] * double(d_o[oat(i, h, d)]);
      for (Token j = 0; j < lk; ++j) {
        if (!unmasked(i, j)) continue;
        const double p = std::exp(score(i, h, j) - lse);
        double dp = 0;
        for (int d = 0; d < s.dv; ++d) dp += double(d_o[oat(i, h, d)]) * double(v[vat(j, kh, d)]);
        const double ds = p * (dp - delta);
        for (int d = 0; d < s.dv; ++d) dv[vat(j, kh, d)] += p * double(d_o[oat(i, h, d)]);
        for (int d = 0; d < s.dqk; ++d) {
          r.dq[qat(i, h, d)] += scale * ds * double(k[kat(j, kh, d)]);
          r.dk[kat(j, kh, d)] += scale * ds * double(q[qat(i, h, d)]);
        }
      }
    }
  }
  return r;
}

}  // namespace cpsched::sim::test
