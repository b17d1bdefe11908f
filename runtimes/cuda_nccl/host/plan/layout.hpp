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

// MLA (docs/heads.md): Q, K, dQ and dK rows hold `dim` (d_qk) per head, V, O,
// dO and dV rows `dim_v`; with `shared` every KV token has one latent row,
// K, whose first dim_v dims are V: there is no V (nor dV) tensor, the kernels
// read V from K's rows and add dV into dK's, and a KV transfer moves the
// latent (and its gradient) once. GQA: dim_v = dim, not shared.
struct HeadLayout {
  int hq = 1;
  int hkv = 1;
  int dim = 1;          // d_qk
  int groups = 1;       // head groups scheduled apart (1 when not flattened)
  int dtype_bytes = 2;
  int dim_v = 0;        // d_v (0: dim, GQA)
  bool shared = false;  // V is K's latent row (its first d_v dims)

  int dv() const { return dim_v > 0 ? dim_v : dim; }

  static HeadLayout of(const Problem& p);

  int local_heads(Tensor t) const { return is_q_side(t) ? hq : hkv; }
  // Heads a row of a split of `group` holds (-1: all heads of the rank's rows).
  int heads(Tensor t, int group) const;
  // First head of `group` inside a local row (0 for -1).
  int head_offset(Tensor t, int group) const;
  bool is_mla() const { return dv() != dim || shared; }
  int elems_per_head(Tensor t) const {
    if (t == Tensor::lse) return 1;
    return t == Tensor::q || t == Tensor::k || t == Tensor::dq || t == Tensor::dk ? dim : dv();
  }
  // Elements per head of a V (or dV) row as stored: dim inside the latent.
  int v_stride() const { return shared ? dim : dv(); }
  int elem_bytes(Tensor t) const { return t == Tensor::lse ? 4 : dtype_bytes; }
  Bytes row_bytes(Tensor t, int group) const {
    return static_cast<Bytes>(heads(t, group)) * elems_per_head(t) * elem_bytes(t);
  }
  Bytes local_row_bytes(Tensor t) const { return row_bytes(t, -1); }
};

// The tensors a collective moves, in the order of its NCCL calls:
// forward QO cast Q, reduce O + lse; forward KV cast K, V; backward QO cast
// Q, O, dO, lse, reduce dQ; backward KV cast K, V, reduce dK, dV.
// With a shared latent a KV transfer moves K alone, and dK (the latent's gradient) alone back.
std::span<const Tensor> cast_tensors(Pass p, RowKind k, bool shared = false);
std::span<const Tensor> reduce_tensors(Pass p, RowKind k, bool shared = false);

}  // namespace cpsched::gpu
