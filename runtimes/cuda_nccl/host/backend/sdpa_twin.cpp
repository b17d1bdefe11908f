#include "sdpa_twin.hpp"

#include <cmath>
#include <fmt/format.h>
#include <limits>
#include <vector>

#include "cpsched/base/error.hpp"

namespace cpsched::gpu {

namespace {

struct Seq {
  i64 sq, sk;
  const bf16 *q, *k, *v, *o, *d_o;
  const float* stats;
  bf16 *out_o, *dq, *dk, *dv;
  float* out_stats;
};

// cuDNN's mask rule for (row i, col j) of a sequence.
struct Allowed {
  i64 shift = 0;
  SdpaBounds bd;
  bool operator()(i64 i, i64 j) const {
    const i64 r = i + shift;
    if (bd.right >= 0 && j > r + bd.right) return false;
    if (bd.left >= 0 && j <= r - bd.left) return false;
    return true;
  }
};

float dot(const bf16* a, const bf16* b, int d) {
  float s = 0.f;
  for (int x = 0; x < d; ++x) s += bf16_to_float(a[x]) * bf16_to_float(b[x]);
  return s;
}

void forward(const SdpaGeometry& g, const Seq& s, const Allowed& ok) {
  const int D = g.dim, ratio = g.q_heads / g.kv_heads;
  const i64 qs = g.q_row_heads * D, ks = g.k_row_heads * D;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> score(static_cast<std::size_t>(s.sk)), acc(static_cast<std::size_t>(D));
  for (int h = 0; h < g.q_heads; ++h) {
    const int kh = h / ratio;
    for (i64 i = 0; i < s.sq; ++i) {
      const bf16* q = s.q + i * qs + h * D;
      float m = -std::numeric_limits<float>::infinity();
      for (i64 j = 0; j < s.sk; ++j) {
        score[static_cast<std::size_t>(j)] =
            ok(i, j) ? dot(q, s.k + j * ks + kh * D, D) * g.scale : -std::numeric_limits<float>::infinity();
        m = std::max(m, score[static_cast<std::size_t>(j)]);
      }
      bf16* o = s.out_o + (i * g.q_heads + h) * D;
      float* st = s.out_stats + i * g.q_heads + h;
      if (std::isinf(m)) {  // no key: undocumented in cuDNN, unusable here
        for (int d = 0; d < D; ++d) o[d] = float_to_bf16(nan);
        *st = nan;
        continue;
      }
      float l = 0.f;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (i64 j = 0; j < s.sk; ++j) {
        const float x = score[static_cast<std::size_t>(j)];
        if (std::isinf(x)) continue;
        const float p = std::exp(x - m);
        l += p;
        const bf16* v = s.v + j * ks + kh * D;
        for (int d = 0; d < D; ++d) acc[static_cast<std::size_t>(d)] += p * bf16_to_float(v[d]);
      }
      for (int d = 0; d < D; ++d) o[d] = float_to_bf16(acc[static_cast<std::size_t>(d)] / l);
      *st = m + std::log(l);
    }
  }
}

void backward(const SdpaGeometry& g, const Seq& s, const Allowed& ok) {
  const int D = g.dim, ratio = g.q_heads / g.kv_heads;
  const i64 qs = g.q_row_heads * D, ks = g.k_row_heads * D;
  const auto n_k = static_cast<std::size_t>(s.sk * g.kv_heads * D);
  std::vector<float> dk(n_k, 0.f), dv(n_k, 0.f), dq(static_cast<std::size_t>(D));
  for (int h = 0; h < g.q_heads; ++h) {
    const int kh = h / ratio;
    for (i64 i = 0; i < s.sq; ++i) {
      const bf16* q = s.q + i * qs + h * D;
      const bf16* o = s.o + i * qs + h * D;
      const bf16* d_o = s.d_o + i * qs + h * D;
      const float lse = s.stats[i * g.q_heads + h];
      const float delta = dot(d_o, o, D);
      std::fill(dq.begin(), dq.end(), 0.f);
      for (i64 j = 0; j < s.sk; ++j) {
        if (!ok(i, j)) continue;
        const bf16* k = s.k + j * ks + kh * D;
        const bf16* v = s.v + j * ks + kh * D;
        const float p = std::exp(dot(q, k, D) * g.scale - lse);
        const float ds = p * (dot(d_o, v, D) - delta);
        float* dkj = dk.data() + (j * g.kv_heads + kh) * D;
        float* dvj = dv.data() + (j * g.kv_heads + kh) * D;
        for (int d = 0; d < D; ++d) {
          dq[static_cast<std::size_t>(d)] += ds * bf16_to_float(k[d]);
          dkj[d] += ds * bf16_to_float(q[d]);
          dvj[d] += p * bf16_to_float(d_o[d]);
        }
      }
      bf16* out = s.dq + (i * g.q_heads + h) * D;
      for (int d = 0; d < D; ++d) out[d] = float_to_bf16(dq[static_cast<std::size_t>(d)] * g.scale);
    }
  }
  for (std::size_t x = 0; x < n_k; ++x) {
    s.dk[x] = float_to_bf16(dk[x] * g.scale);
    s.dv[x] = float_to_bf16(dv[x]);
  }
}

}  // namespace

void sdpa_twin(const SdpaGeometry& g, const SdpaBind& b) {
  if (g.q_heads <= 0 || g.kv_heads <= 0 || g.q_heads % g.kv_heads != 0)
    throw Error(fmt::format("cuda_nccl SDPA twin: heads {}:{}", g.q_heads, g.kv_heads));
  const SdpaBounds bd = sdpa_bounds(g.mask, g.band);
  for (int x = 0; x < g.batch; ++x) {
    const i64 sq = b.seq_q[x], sk = b.seq_k[x];
    if (sq < 0 || sk < 0 || sq > g.max_q || sk > g.max_k)
      throw Error(fmt::format("cuda_nccl SDPA twin: sequence {} of {} has {} x {} rows beyond the graph's {} x {}", x,
                              describe(g), sq, sk, g.max_q, g.max_k));
    Seq s{sq, sk, b.q + b.q_off[x], b.k + b.k_off[x], b.v + b.k_off[x], nullptr, nullptr, nullptr,
          nullptr, nullptr, nullptr, nullptr, nullptr};
    const Allowed ok{bd.bottom_right ? sk - sq : 0, bd};
    if (g.pass == Pass::fwd) {
      s.out_o = b.out_o + b.out_q_off[x];
      s.out_stats = b.out_stats + b.out_stats_off[x];
      forward(g, s, ok);
    } else {
      s.o = b.o + b.q_off[x];
      s.d_o = b.d_o + b.q_off[x];
      s.stats = b.stats + b.out_stats_off[x];
      s.dq = b.dq + b.out_q_off[x];
      s.dk = b.dk + b.out_k_off[x];
      s.dv = b.dv + b.out_k_off[x];
      backward(g, s, ok);
    }
  }
}

}  // namespace cpsched::gpu
