#include "reference.hpp"

#include <limits>

#include "attention_kernel.hpp"
#include "lse_merge.hpp"

namespace cpsched::sim {

GlobalOutputs dense_reference(const Problem& p, const GlobalInputs& in, int threads) {
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
