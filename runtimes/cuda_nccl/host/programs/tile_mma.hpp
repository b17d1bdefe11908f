#pragma once
// One warp's 16 x 16 tile product on tensor cores, and its CPU twin:
//
//   C[16 x 16] (fp32, shared memory, row-major, ldc) += A[16 x K] * B[K x 16]
//
// A and B are bf16 in shared memory, each row-major or column-major
// (RowMajor / ColMajor): A row-major is A[i][k] = a[i * lda + k], column-major
// a[k * lda + i]; B row-major is B[k][j] = b[k * ldb + j], column-major
// b[j * ldb + k] (so "B column-major" reads a row-major B^T, as Q K^T needs).
// On the GPU the warp runs WMMA's bf16 m16n16k16 (fp32 accumulation); on the
// CPU one call runs the same product with scalar fp32 arithmetic. The kernel
// programs (index_programs.hpp) call it from `ex.warps(f)`, once per warp.
//
// WMMA's rules, kept by every caller: K a multiple of 16; lda, ldb multiples
// of 8 elements and ldc of 4; each tile's first element 32-byte aligned.
#include <type_traits>

#include "hd.hpp"

#if defined(__CUDA_ARCH__)
#include <cuda_bf16.h>
#include <mma.h>
#endif

namespace cpsched::gpu {

struct RowMajor {};
struct ColMajor {};

#if defined(__CUDA_ARCH__)
namespace detail {
template <class L>
struct WmmaLayout;
template <>
struct WmmaLayout<RowMajor> {
  using type = nvcuda::wmma::row_major;
};
template <>
struct WmmaLayout<ColMajor> {
  using type = nvcuda::wmma::col_major;
};
}  // namespace detail
#endif

// C (+)= A B over K (a multiple of 16); one warp (GPU) or one call (CPU).
// kAccumulate false: C = A B (C's old contents ignored).
template <int K, class LA, class LB, bool kAccumulate>
CPSCHED_HD inline void warp_mma(float* c, int ldc, const bf16* a, int lda, const bf16* b, int ldb) {
  static_assert(K % 16 == 0, "warp_mma: K must be a multiple of 16");
#if defined(__CUDA_ARCH__)
  using namespace nvcuda;
  using LayA = typename detail::WmmaLayout<LA>::type;
  using LayB = typename detail::WmmaLayout<LB>::type;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  if constexpr (kAccumulate) wmma::load_matrix_sync(acc, c, static_cast<unsigned>(ldc), wmma::mem_row_major);
  else wmma::fill_fragment(acc, 0.f);
  auto step = [&](int k0) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LayA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LayB> fb;
    const bf16* ap = std::is_same_v<LA, RowMajor> ? a + k0 : a + k0 * lda;
    const bf16* bp = std::is_same_v<LB, RowMajor> ? b + k0 * ldb : b + k0;
    wmma::load_matrix_sync(fa, reinterpret_cast<const __nv_bfloat16*>(ap), static_cast<unsigned>(lda));
    wmma::load_matrix_sync(fb, reinterpret_cast<const __nv_bfloat16*>(bp), static_cast<unsigned>(ldb));
    wmma::mma_sync(acc, fa, fb, acc);
  };
  if constexpr (K > 256) {
    // MLA's 576 / 512: a full unroll spilled in the dK / dV program (ptxas -v, sm_90).
#pragma unroll 4
    for (int k0 = 0; k0 < K; k0 += 16) step(k0);
  } else {
    CPSCHED_UNROLL
    for (int k0 = 0; k0 < K; k0 += 16) step(k0);
  }
  wmma::store_matrix_sync(c, acc, static_cast<unsigned>(ldc), wmma::mem_row_major);
#else
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float s = kAccumulate ? c[i * ldc + j] : 0.f;
      for (int k = 0; k < K; ++k) {
        const bf16 x = std::is_same_v<LA, RowMajor> ? a[i * lda + k] : a[k * lda + i];
        const bf16 y = std::is_same_v<LB, RowMajor> ? b[k * ldb + j] : b[j * ldb + k];
        s += bf16_to_float(x) * bf16_to_float(y);
      }
      c[i * ldc + j] = s;
    }
#endif
}

}  // namespace cpsched::gpu
