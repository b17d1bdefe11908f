#include "layout.hpp"

#include <fmt/format.h>

#include "cpsched/base/error.hpp"

namespace cpsched::gpu {

std::string_view to_string(Tensor t) {
  static constexpr std::array<std::string_view, kNumTensors> kNames{"q", "k", "v", "o", "lse", "do", "dq", "dk", "dv"};
  return kNames[static_cast<std::size_t>(t)];
}

std::string_view to_string(Pass p) { return p == Pass::fwd ? "fwd" : "bwd"; }


bool is_q_side(Tensor t) {
  return t == Tensor::q || t == Tensor::o || t == Tensor::lse || t == Tensor::d_o || t == Tensor::dq;
}

HeadLayout HeadLayout::of(const Problem& p) {
  HeadLayout h{p.heads.q, p.heads.kv, p.heads.dqk(), p.num_groups(), p.heads.dtype_bytes, p.heads.dv(),
               p.heads.kv_shared};
  if (h.hq <= 0 || h.hkv <= 0 || h.hq % h.hkv != 0 || h.groups <= 0 || h.hkv % h.groups != 0 || h.dim <= 0 ||
      h.dv() <= 0 || h.dtype_bytes <= 0 || (h.shared && h.dv() > h.dim))
    throw Error(fmt::format("cuda_nccl: unsupported heads q={} kv={} d_qk={} d_v={}{} dtype_bytes={} with {} head groups",
                            h.hq, h.hkv, h.dim, h.dv(), h.shared ? " (shared latent)" : "", h.dtype_bytes, h.groups));
  return h;
}

int HeadLayout::heads(Tensor t, int group) const {
  if (group < 0) return local_heads(t);
  if (group >= groups) throw Error(fmt::format("cuda_nccl: head group {} outside [0, {})", group, groups));
  return local_heads(t) / groups;
}

int HeadLayout::head_offset(Tensor t, int group) const { return group < 0 ? 0 : group * heads(t, group); }

namespace {
constexpr std::array kFwdQoCast{Tensor::q};
constexpr std::array kFwdQoReduce{Tensor::o, Tensor::lse};
constexpr std::array kKvCast{Tensor::k, Tensor::v};
constexpr std::array kLatentCast{Tensor::k};
constexpr std::array kLatentReduce{Tensor::dk};
constexpr std::array kBwdQoCast{Tensor::q, Tensor::o, Tensor::d_o, Tensor::lse};
constexpr std::array kBwdQoReduce{Tensor::dq};
constexpr std::array kBwdKvReduce{Tensor::dk, Tensor::dv};
}  // namespace

std::span<const Tensor> cast_tensors(Pass p, RowKind k, bool shared) {
  if (k == RowKind::kv) return shared ? std::span<const Tensor>(kLatentCast) : std::span<const Tensor>(kKvCast);
  return p == Pass::fwd ? std::span<const Tensor>(kFwdQoCast) : std::span<const Tensor>(kBwdQoCast);
}

std::span<const Tensor> reduce_tensors(Pass p, RowKind k, bool shared) {
  if (p == Pass::fwd) return k == RowKind::qo ? std::span<const Tensor>(kFwdQoReduce) : std::span<const Tensor>();
  if (k == RowKind::qo) return kBwdQoReduce;
  return shared ? std::span<const Tensor>(kLatentReduce) : std::span<const Tensor>(kBwdKvReduce);
}

}  // namespace cpsched::gpu
