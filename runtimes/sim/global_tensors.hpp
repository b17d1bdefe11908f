#pragma once
// The tensors of a numeric run in global token order: inputs drawn from a
// seeded generator, and the outputs (of the reference, or gathered from the
// virtual ranks for comparison). Layout: row-major [S x heads x dim] with
// dim = d_qk for Q, K, dQ, dK and d_v for V, O, dO, dV; lse [S x hq]. With a
// shared latent (MLA) V and dV are empty: V is K's first d_v dims and dK
// holds the latent's whole gradient.
#include <cstdint>
#include <vector>

#include "cpsched/problem/problem.hpp"

namespace cpsched::sim {

struct GlobalInputs {
  Token seqlen = 0;
  int hq = 0, hkv = 0, dim = 0, dim_v = 0;  // dim = d_qk, dim_v = d_v (resolved, never 0)
  bool kv_shared = false;
  std::vector<float> q, k, v, d_o;

  std::int64_t q_width() const { return std::int64_t{hq} * dim; }    // Q, dQ
  std::int64_t o_width() const { return std::int64_t{hq} * dim_v; }  // O, dO
  std::int64_t k_width() const { return std::int64_t{hkv} * dim; }   // K, dK
  std::int64_t v_width() const { return kv_shared ? 0 : std::int64_t{hkv} * dim_v; }

  // Uniform in [-1, 1), a pure function of (seed, tensor, index): the same
  // values for any thread count or sharding.
  static GlobalInputs generate(const Problem& p, std::uint64_t seed);
};

struct GlobalOutputs {
  std::vector<float> o, lse, dq, dk, dv;
  // Sized for `in`; o/dq/dk/dv filled with `fill`, lse with `lse_fill`.
  static GlobalOutputs like(const GlobalInputs& in, float fill, float lse_fill);
};

// Bytes a numeric run holds at its peak (inputs, reference, P ranks' copies,
// remote buffers bounded by the local ones); used to refuse runs that do not fit.
double numeric_bytes_estimate(const Problem& p);

}  // namespace cpsched::sim
