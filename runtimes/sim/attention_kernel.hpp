#pragma once
// CPU attention kernel over one range arg (q rows x k cols with a mask type),
// float32, tiled with an online softmax: the computation a GPU rank runs for
// each AttnArg of a plan. GQA: q head h reads kv head h / (q_heads / kv_heads).
// Scale 1/sqrt(dim); lse is the natural log of the row's sum of exp(scores).
// A row without unmasked entries has lse = -inf and O = 0.
#include <vector>

#include "cpsched/mask/mask.hpp"
#include "tensor_view.hpp"

namespace cpsched::sim {

// dim is d_qk (Q, K, dQ, dK rows per head); dim_v is d_v (V, O, dO, dV; 0 =
// dim). kv_shared (MLA's latent): V is the first d_v dims of K's rows, so the
// v view is the k view (head stride dim) and a dv view aliasing dk makes dK
// and dV accumulate into one latent gradient.
struct KernelShape {
  int q_heads = 1;   // heads of the call; a multiple of kv_heads
  int kv_heads = 1;
  int dim = 1;
  int dim_v = 0;
  bool kv_shared = false;
  int dv() const { return dim_v > 0 ? dim_v : dim; }
  int v_head_stride() const { return kv_shared ? dim : dv(); }  // elements between kv heads in v / dv
};

// One call's output for the arg's q rows: o[(r * q_heads + h) * dim + d]
// (dim = d_v), lse[r * q_heads + h], r relative to arg.q.begin.
struct Partial {
  Token rows = 0;
  int heads = 0;
  int dim = 0;
  std::vector<float> o;
  std::vector<float> lse;
  CView o_view() const { return {o.data(), static_cast<std::int64_t>(heads) * dim}; }
  CView lse_view() const { return {lse.data(), heads}; }
};

// `arg` is a slice in view coordinates: rows arg.q of q, rows arg.k of k and v.
// Views point at head 0 of the call (q: q_heads heads, k/v: kv_heads heads).
// threads: upper bound (small calls run inline); the result is the same for
// any thread count.
Partial attention_forward(const KernelShape& shape, CView q, CView k, CView v, const Slice& arg,
                          int threads = 1);

// Inputs of the backward pass over the same arg: lse and o are the row's
// FINAL values (after every partial was merged), do the output gradient.
// lse views have one float per head.
struct BackwardInputs {
  CView q, k, v, o, d_o, lse;
};
// Gradients are accumulated (+=) into these views (rows as in the inputs).
struct BackwardOutputs {
  MView dq, dk, dv;
};

// dS = P * (dP - rowsum(dO * O)), P = exp(scale * S - lse), dP = dO V^T;
// dQ += scale dS K, dK += scale dS^T Q, dV += P^T dO. dK/dV of a kv head sum
// over its q heads. Deterministic for any thread count.
void attention_backward(const KernelShape& shape, const BackwardInputs& in, const BackwardOutputs& out,
                        const Slice& arg, int threads = 1);

// Multiply-adds of a call (for thread sizing and tests): area x q_heads x
// (d_qk + d_v) / 2 (area x q_heads x dim under GQA).
double attention_work(const KernelShape& shape, const Slice& arg);

}  // namespace cpsched::sim
