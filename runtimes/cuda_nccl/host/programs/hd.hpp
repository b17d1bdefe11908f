#pragma once
// Code shared by the CUDA kernels and their CPU twins: functions marked
// CPSCHED_HD compile as __host__ __device__ under nvcc and as plain C++ under
// g++, so the CPU tests run the very code the GPU runs. No CUDA header here.
#include <cstdint>
#include <cmath>
#include <cstring>

#if defined(__CUDACC__)
#define CPSCHED_HD __host__ __device__
#else
#define CPSCHED_HD
#endif
// Only the device pass knows the pragma (the host compiler would warn).
#if defined(__CUDA_ARCH__)
#define CPSCHED_UNROLL _Pragma("unroll")
#else
#define CPSCHED_UNROLL
#endif

namespace cpsched::gpu {

// bf16 is stored as its raw 16 bits everywhere (host and device), so that
// layouts never depend on a CUDA type.
using bf16 = std::uint16_t;

CPSCHED_HD inline float bits_to_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

CPSCHED_HD inline std::uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

CPSCHED_HD inline float bf16_to_float(bf16 b) { return bits_to_float(static_cast<std::uint32_t>(b) << 16); }

// Round to nearest even, as the hardware conversion does; NaN stays NaN.
CPSCHED_HD inline bf16 float_to_bf16(float f) {
  std::uint32_t u = float_to_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) return static_cast<bf16>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<bf16>(u >> 16);
}

CPSCHED_HD inline float neg_inf() { return bits_to_float(0xff800000u); }
CPSCHED_HD inline bool is_neg_inf(float x) { return float_to_bits(x) == 0xff800000u; }

// expf/logf exist as the same names on both sides.
CPSCHED_HD inline float hd_exp(float x) { return ::expf(x); }
CPSCHED_HD inline float hd_log(float x) { return ::logf(x); }

template <class T>
CPSCHED_HD inline T hd_min(T a, T b) { return a < b ? a : b; }
template <class T>
CPSCHED_HD inline T hd_max(T a, T b) { return a > b ? a : b; }

}  // namespace cpsched::gpu
