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
  // The kernels and buffers hold one head dim for every tensor: MLA (d_v !=
  // d_qk, or V sharing K's latent row) is refused before anything is sized.
  if (!p.heads.is_gqa())
    throw Error(fmt::format("cuda_nccl: MLA head geometry (d_qk {}, d_v {}{}) is not supported: its kernels and "
                            "buffers are built for GQA (one head dim for Q, K, V and O); run it on the sim executor",
                            p.heads.dqk(), p.heads.dv(), p.heads.kv_shared ? ", shared KV latent" : ""));
  HeadLayout h{p.heads.q, p.heads.kv, p.heads.dim, p.num_groups(), p.heads.dtype_bytes};
  if (h.hq <= 0 || h.hkv <= 0 || h.hq % h.hkv != 0 || h.groups <= 0 || h.hkv % h.groups != 0 || h.dim <= 0 ||
      h.dtype_bytes <= 0)
    throw Error(fmt::format("cuda_nccl: unsupported heads q={} kv={} dim={} dtype_bytes={} with {} head groups",
                            h.hq, h.hkv, h.dim, h.dtype_bytes, h.groups));
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
constexpr std::array kBwdQoCast{Tensor::q, Tensor::o, Tensor::d_o, Tensor::lse};
constexpr std::array kBwdQoReduce{Tensor::dq};
constexpr std::array kBwdKvReduce{Tensor::dk, Tensor::dv};
}  // namespace

std::span<const Tensor> cast_tensors(Pass p, RowKind k) {
  if (k == RowKind::kv) return kKvCast;
  return p == Pass::fwd ? std::span<const Tensor>(kFwdQoCast) : std::span<const Tensor>(kBwdQoCast);
}

std::span<const Tensor> reduce_tensors(Pass p, RowKind k) {
  if (p == Pass::fwd) return k == RowKind::qo ? std::span<const Tensor>(kFwdQoReduce) : std::span<const Tensor>();
  return k == RowKind::qo ? std::span<const Tensor>(kBwdQoReduce) : std::span<const Tensor>(kBwdKvReduce);
}

}  // namespace cpsched::gpu
