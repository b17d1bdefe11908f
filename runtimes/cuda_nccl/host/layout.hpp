#pragma once
// Tensors, their rows and their bytes: what one token of a buffer holds for
// each tensor the two passes move (docs/design.md#metrics), given the heads of a split's
// head group, the head dim and the dtype. lse and the softmax row statistic
// are fp32, one value per head.
#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include "cpsched/problem/metrics.hpp"
#include "cpsched/problem/problem.hpp"

namespace cpsched::gpu {

enum class Tensor : std::uint8_t { q, k, v, o, lse, d_o, dq, dk, dv };
inline constexpr int kNumTensors = 9;
std::string_view to_string(Tensor t);

enum class Pass : std::uint8_t { fwd, bwd };
std::string_view to_string(Pass p);

bool is_q_side(Tensor t);  // rows of the QO buffers (q, o, lse, d_o, dq); else KV

struct HeadLayout {
  int hq = 1;
  int hkv = 1;
  int dim = 1;
  int groups = 1;       // head groups scheduled apart (1 when not flattened)
  int dtype_bytes = 2;

  static HeadLayout of(const Problem& p);

  int local_heads(Tensor t) const { return is_q_side(t) ? hq : hkv; }
  // Heads a row of a split of `group` holds (-1: all heads of the rank's rows).
  int heads(Tensor t, int group) const;
  // First head of `group` inside a local row (0 for -1).
  int head_offset(Tensor t, int group) const;
  int elems_per_head(Tensor t) const { return t == Tensor::lse ? 1 : dim; }
  int elem_bytes(Tensor t) const { return t == Tensor::lse ? 4 : dtype_bytes; }
  Bytes row_bytes(Tensor t, int group) const {
    return static_cast<Bytes>(heads(t, group)) * elems_per_head(t) * elem_bytes(t);
  }
  Bytes local_row_bytes(Tensor t) const { return row_bytes(t, -1); }
};

// The tensors a collective moves, in the order of its NCCL calls:
// forward QO cast Q, reduce O + lse; forward KV cast K, V; backward QO cast
// Q, O, dO, lse, reduce dQ; backward KV cast K, V, reduce dK, dV.
std::span<const Tensor> cast_tensors(Pass p, RowKind k);
std::span<const Tensor> reduce_tensors(Pass p, RowKind k);

}  // namespace cpsched::gpu
