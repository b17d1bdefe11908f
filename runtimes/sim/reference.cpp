#include "reference.hpp"

#include <algorithm>
#include <limits>
#include <vector>

#include "cpsched/base/error.hpp"
#include "attention_kernel.hpp"
#include "index_kernel.hpp"
#include "lse_merge.hpp"

namespace cpsched::sim {

namespace {

// Masks that differ by KV head, or index masks: each KV head's rows against
// the problem's boolean mask of that head (dense_mask), key by key.
GlobalOutputs boolean_reference(const Problem& p, const GlobalInputs& in, int threads) {
  GlobalOutputs out = GlobalOutputs::like(in, 0.0f, -std::numeric_limits<float>::infinity());
  const int ratio = in.hq / in.hkv;
  const KernelShape shape{ratio, 1, in.dim, in.dim_v, in.kv_shared};
  const std::int64_t qw = in.q_width(), ow = in.o_width(), kw = in.k_width(), vw = in.v_width();
  const int DV = shape.dv(), VS = in.kv_shared ? in.dim : DV;
  const Token S = p.seqlen();
  const bool per_head = p.index_mask ? p.index_mask->kv_heads > 1 : !p.head_masks.empty();
  for (int h = 0; h < in.hkv; ++h) {
    const std::vector<std::uint8_t> mask = dense_mask(p, per_head ? h : 0);
    std::int32_t width = 1;
    for (Token q = 0; q < S; ++q) {
      std::int32_t n = 0;
      for (Token k = 0; k < S; ++k) n += mask[static_cast<std::size_t>(q * S + k)];
      width = std::max(width, n);
    }
    std::vector<std::int32_t> keys(static_cast<std::size_t>(S * width), -1);
    for (Token q = 0; q < S; ++q) {
      std::int32_t n = 0;
      for (Token k = 0; k < S; ++k)
        if (mask[static_cast<std::size_t>(q * S + k)] != 0) keys[static_cast<std::size_t>(q * width + n++)] = static_cast<std::int32_t>(k);
    }
    const IndexRows rows{keys.data(), width};
    const std::int64_t q0 = static_cast<std::int64_t>(h) * ratio;
    const CView q{in.q.data() + q0 * in.dim, qw}, k{in.k.data() + static_cast<std::int64_t>(h) * in.dim, kw};
    const CView v = in.kv_shared ? k : CView{in.v.data() + static_cast<std::int64_t>(h) * VS, vw};
    const Partial part = attention_forward_index(shape, q, k, v, {0, S}, rows, threads);
    merge_rows(MView{out.o.data() + q0 * DV, ow}, MView{out.lse.data() + q0, in.hq}, part.o_view(), part.lse_view(),
               part.rows, ratio, DV);
    const BackwardInputs bin{q, k, v, CView{out.o.data() + q0 * DV, ow}, CView{in.d_o.data() + q0 * DV, ow},
                             CView{out.lse.data() + q0, in.hq}};
    const MView dk{out.dk.data() + static_cast<std::int64_t>(h) * in.dim, kw};
    const BackwardOutputs bout{MView{out.dq.data() + q0 * in.dim, qw}, dk,
                               in.kv_shared ? dk : MView{out.dv.data() + static_cast<std::int64_t>(h) * VS, vw}};
    attention_backward_index(shape, bin, bout, {0, S}, rows, threads);
  }
  return out;
}

}  // namespace

GlobalOutputs dense_reference(const Problem& p, const GlobalInputs& in, int threads) {
  if (p.index_summary)
    throw Error("sim: the problem holds one rank's top-k rows (made from per-rank summaries); the reference needs "
                "the whole index mask");
  if (p.index_mask || !p.head_masks.empty()) return boolean_reference(p, in, threads);
  GlobalOutputs out = GlobalOutputs::like(in, 0.0f, -std::numeric_limits<float>::infinity());
  const KernelShape shape{in.hq, in.hkv, in.dim, in.dim_v, in.kv_shared};
  const std::int64_t qw = in.q_width(), ow = in.o_width(), kw = in.k_width(), vw = in.v_width();
  // A shared latent: V reads K's rows and dV accumulates into dK.
  const CView q{in.q.data(), qw}, k{in.k.data(), kw};
  const CView v = in.kv_shared ? k : CView{in.v.data(), vw};
  for (const Slice& s : p.mask.slices()) {
    const Partial part = attention_forward(shape, q, k, v, s, threads);
    merge_rows(MView{out.o.data(), ow}.from(s.q.begin), MView{out.lse.data(), in.hq}.from(s.q.begin),
               part.o_view(), part.lse_view(), part.rows, in.hq, in.dim_v);
  }
  const BackwardInputs bin{q, k, v, CView{out.o.data(), ow}, CView{in.d_o.data(), ow}, CView{out.lse.data(), in.hq}};
  const MView dk{out.dk.data(), kw};
  const BackwardOutputs bout{MView{out.dq.data(), qw}, dk, in.kv_shared ? dk : MView{out.dv.data(), vw}};
  for (const Slice& s : p.mask.slices()) attention_backward(shape, bin, bout, s, threads);
  return out;
}

}  // namespace cpsched::sim
