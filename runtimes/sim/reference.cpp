#include "reference.hpp"

#include <limits>

#include "attention_kernel.hpp"
#include "lse_merge.hpp"

namespace cpsched::sim {

GlobalOutputs dense_reference(const Problem& p, const GlobalInputs& in, int threads) {
  GlobalOutputs out = GlobalOutputs::like(in, 0.0f, -std::numeric_limits<float>::infinity());
  const KernelShape shape{in.hq, in.hkv, in.dim};
  const std::int64_t qw = static_cast<std::int64_t>(in.hq) * in.dim, kw = static_cast<std::int64_t>(in.hkv) * in.dim;
  const CView q{in.q.data(), qw}, k{in.k.data(), kw}, v{in.v.data(), kw};
  for (const Slice& s : p.mask.slices()) {
    const Partial part = attention_forward(shape, q, k, v, s, threads);
    merge_rows(MView{out.o.data(), qw}.from(s.q.begin), MView{out.lse.data(), in.hq}.from(s.q.begin),
               part.o_view(), part.lse_view(), part.rows, in.hq, in.dim);
  }
  const BackwardInputs bin{q, k, v, CView{out.o.data(), qw}, CView{in.d_o.data(), qw}, CView{out.lse.data(), in.hq}};
  const BackwardOutputs bout{MView{out.dq.data(), qw}, MView{out.dk.data(), kw}, MView{out.dv.data(), kw}};
  for (const Slice& s : p.mask.slices()) attention_backward(shape, bin, bout, s, threads);
  return out;
}

}  // namespace cpsched::sim
