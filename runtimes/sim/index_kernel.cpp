#include "index_kernel.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "parallel.hpp"

namespace cpsched::sim {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

}  // namespace

Partial attention_forward_index(const KernelShape& shape, CView q, CView k, CView v, Range q_rows, IndexRows idx,
                                int threads) {
  const int H = shape.q_heads, D = shape.dim, DV = shape.dv(), VS = shape.v_head_stride();
  const int ratio = H / shape.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const Token rows = q_rows.size();
  Partial out;
  out.rows = rows;
  out.heads = H;
  out.dim = DV;
  out.o.assign(static_cast<std::size_t>(rows * H * DV), 0.0f);
  out.lse.assign(static_cast<std::size_t>(rows * H), kNegInf);
  const double work = static_cast<double>(rows) * idx.width * H * 0.5 * (D + DV);
  parallel_for(rows, threads_for_work(work, threads), [&](std::int64_t r) {
    const std::int32_t* keys = idx.keys + r * idx.width;
    std::vector<float> s(static_cast<std::size_t>(idx.width));
    for (int h = 0; h < H; ++h) {
      const int kh = h / ratio;
      const float* qi = q.row(q_rows.begin + r) + static_cast<std::ptrdiff_t>(h) * D;
      float mx = kNegInf;
      for (std::int32_t j = 0; j < idx.width; ++j) {
        if (keys[j] < 0) continue;
        s[static_cast<std::size_t>(j)] = scale * dot(qi, k.row(keys[j]) + static_cast<std::ptrdiff_t>(kh) * D, D);
        mx = std::max(mx, s[static_cast<std::size_t>(j)]);
      }
      if (mx == kNegInf) continue;  // nothing selected: O = 0, lse = -inf
      float l = 0.0f;
      float* o = out.o.data() + static_cast<std::size_t>((r * H + h) * DV);
      for (std::int32_t j = 0; j < idx.width; ++j) {
        if (keys[j] < 0) continue;
        const float p = std::exp(s[static_cast<std::size_t>(j)] - mx);
        l += p;
        const float* vj = v.row(keys[j]) + static_cast<std::ptrdiff_t>(kh) * VS;
        for (int d = 0; d < DV; ++d) o[d] += p * vj[d];
      }
      for (int d = 0; d < DV; ++d) o[d] /= l;
      out.lse[static_cast<std::size_t>(r * H + h)] = mx + std::log(l);
    }
  });
  return out;
}

void attention_backward_index(const KernelShape& shape, const BackwardInputs& in, const BackwardOutputs& out,
                              Range q_rows, IndexRows idx, int threads) {
  const int H = shape.q_heads, HK = shape.kv_heads, D = shape.dim, DV = shape.dv(), VS = shape.v_head_stride();
  const int ratio = H / HK;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const Token rows = q_rows.size();
  const double work = 2.5 * static_cast<double>(rows) * idx.width * H * 0.5 * (D + DV);
  // One item per kv head: its q heads' dQ rows and its own dK / dV heads.
  parallel_for(HK, threads_for_work(work, threads), [&](std::int64_t kh) {
    std::vector<float> p(static_cast<std::size_t>(idx.width)), ds(p.size());
    for (Token r = 0; r < rows; ++r) {
      const Token i = q_rows.begin + r;
      const std::int32_t* keys = idx.keys + r * idx.width;
      for (int h = static_cast<int>(kh) * ratio; h < (static_cast<int>(kh) + 1) * ratio; ++h) {
        const float lse = in.lse.row(i)[h];
        if (lse == kNegInf) continue;
        const float* qi = in.q.row(i) + static_cast<std::ptrdiff_t>(h) * D;
        const float* doi = in.d_o.row(i) + static_cast<std::ptrdiff_t>(h) * DV;
        const float delta = dot(in.o.row(i) + static_cast<std::ptrdiff_t>(h) * DV, doi, DV);
        float* dqi = out.dq.row(i) + static_cast<std::ptrdiff_t>(h) * D;
        for (std::int32_t j = 0; j < idx.width; ++j) {
          if (keys[j] < 0) continue;
          const float* kj = in.k.row(keys[j]) + kh * D;
          const float* vj = in.v.row(keys[j]) + kh * VS;
          const float pj = std::exp(scale * dot(qi, kj, D) - lse);
          const float dsj = pj * (dot(doi, vj, DV) - delta);
          for (int d = 0; d < D; ++d) dqi[d] += scale * dsj * kj[d];
          float* dkj = out.dk.row(keys[j]) + kh * D;
          for (int d = 0; d < D; ++d) dkj[d] += scale * dsj * qi[d];
          float* dvj = out.dv.row(keys[j]) + kh * VS;
          for (int d = 0; d < DV; ++d) dvj[d] += pj * doi[d];
        }
      }
    }
  });
}

}  // namespace cpsched::sim
