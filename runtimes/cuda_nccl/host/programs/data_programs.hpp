#pragma once
// Data-movement kernels as CTA programs (see attention_programs.hpp for the
// Exec contract): pack of group-cast messages, the lse-weighted merge and the
// sum of group-reduce messages, fp32 -> bf16 conversion, fills and the
// backward's row statistic delta = rowsum(dO * O).
#include "attention_programs.hpp"

namespace cpsched::gpu {

inline constexpr int kDataThreads = 256;

struct NoState {};

// CTA bx copies segment bx, 16 bits at a time (every row size is even).
struct CopyProgram {
  static constexpr int kThreads = kDataThreads;
  using State = NoState;
  struct Smem {};
  const CopySeg* segs;

  template <class Exec>
  CPSCHED_HD void operator()(Exec& ex, int bx, int, Smem&) const {
    const CopySeg s = segs[bx];
    const i64 units = s.row_bytes / 2, total = s.rows * units;
    ex.each([&](int t, State&) {
      for (i64 i = t; i < total; i += kThreads) {
        const i64 r = i / units, u = i % units;
        std::uint16_t x;
        std::memcpy(&x, s.src + r * s.src_stride + 2 * u, 2);
        std::memcpy(s.dst + r * s.dst_stride + 2 * u, &x, 2);
      }
    });
  }
};

// CTA bx merges segment bx, one (row, head) per thread and step.
struct MergeProgram {
  static constexpr int kThreads = kDataThreads;
  using State = NoState;
  struct Smem {};
  const MergeSeg* segs;

  template <class Exec>
  CPSCHED_HD void operator()(Exec& ex, int bx, int, Smem&) const {
    const MergeSeg s = segs[bx];
    const i64 total = s.rows * s.heads;
    ex.each([&](int t, State&) {
      for (i64 i = t; i < total; i += kThreads) {
        const i64 r = i / s.heads, h = i % s.heads;
        const bf16* o = s.o + (r * s.heads + h) * s.dim;
        merge_into(s.o_acc + r * s.acc_o_stride + h * s.dim, s.lse_acc + r * s.acc_lse_stride + h,
                   [&](int d) { return bf16_to_float(o[d]); }, s.lse[r * s.heads + h], s.dim);
      }
    });
  }
};

// CTA bx adds segment bx into its accumulator rows.
struct SumProgram {
  static constexpr int kThreads = kDataThreads;
  using State = NoState;
  struct Smem {};
  const SumSeg* segs;

  template <class Exec>
  CPSCHED_HD void operator()(Exec& ex, int bx, int, Smem&) const {
    const SumSeg s = segs[bx];
    const i64 total = s.rows * s.width;
    ex.each([&](int t, State&) {
      for (i64 i = t; i < total; i += kThreads) {
        const i64 r = i / s.width, c = i % s.width;
        s.acc[r * s.acc_stride + c] += bf16_to_float(s.src[i]);
      }
    });
  }
};

// Grid-stride element loops over `ctas` CTAs.
struct ConvertProgram {
  static constexpr int kThreads = kDataThreads;
  using State = NoState;
  struct Smem {};
  const float* src;
  bf16* dst;
  i64 n;
  int ctas;

  template <class Exec>
  CPSCHED_HD void operator()(Exec& ex, int bx, int, Smem&) const {
    ex.each([&](int t, State&) {
      for (i64 i = static_cast<i64>(bx) * kThreads + t; i < n; i += static_cast<i64>(ctas) * kThreads)
        dst[i] = float_to_bf16(src[i]);
    });
  }
};

struct FillProgram {
  static constexpr int kThreads = kDataThreads;
  using State = NoState;
  struct Smem {};
  float* dst;
  i64 n;
  float value;
  int ctas;

  template <class Exec>
  CPSCHED_HD void operator()(Exec& ex, int bx, int, Smem&) const {
    ex.each([&](int t, State&) {
      for (i64 i = static_cast<i64>(bx) * kThreads + t; i < n; i += static_cast<i64>(ctas) * kThreads) dst[i] = value;
    });
  }
};

// delta[r, h] = sum_d dO[r, h, d] * O[r, h, d] over rows x heads.
struct DeltaProgram {
  static constexpr int kThreads = kDataThreads;
  using State = NoState;
  struct Smem {};
  const bf16* o;
  const bf16* d_o;
  float* delta;
  i64 row_heads;  // rows x heads
  int dim;
  int ctas;

  template <class Exec>
  CPSCHED_HD void operator()(Exec& ex, int bx, int, Smem&) const {
    ex.each([&](int t, State&) {
      for (i64 i = static_cast<i64>(bx) * kThreads + t; i < row_heads; i += static_cast<i64>(ctas) * kThreads) {
        float acc = 0.f;
        for (int d = 0; d < dim; ++d) acc += bf16_to_float(o[i * dim + d]) * bf16_to_float(d_o[i * dim + d]);
        delta[i] = acc;
      }
    });
  }
};

// Grid-stride CTAs for n elements (at least one, at most `cap`).
inline int grid_stride_ctas(i64 n, int cap = 4096) {
  const i64 c = (n + kDataThreads - 1) / kDataThreads;
  return static_cast<int>(c < 1 ? 1 : (c > cap ? cap : c));
}

}  // namespace cpsched::gpu
