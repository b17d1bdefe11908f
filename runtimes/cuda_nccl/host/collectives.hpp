#pragma once
// Small host-level collectives over a Backend's point-to-point groups (NCCL on
// GPUs, mailboxes in the emulation): the broadcast plan, the per-rank figures
// and the self-check's outputs. Bytes go through device memory, as NCCL needs.
// Every rank must call them in the same order.
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend.hpp"

namespace cpsched::gpu {

using Blob = std::vector<std::uint8_t>;

// Root r0 = 0 sends blobs[r] to rank r (blobs is read on rank 0 only; its own
// entry is returned without a transfer).
Blob scatter_from_root(Backend& be, const std::vector<Blob>* blobs);
// Every rank's blob at rank 0 (index = rank); empty on the other ranks.
std::vector<Blob> gather_to_root(Backend& be, const Blob& mine);
// Rank 0's blob on every rank.
Blob broadcast_from_root(Backend& be, const Blob& root_blob);

template <class T>
Blob to_blob(const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(v.data());
  return Blob(p, p + v.size() * sizeof(T));
}

template <class T>
std::vector<T> from_blob(const Blob& b) {
  std::vector<T> v(b.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

}  // namespace cpsched::gpu
