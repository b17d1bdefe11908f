#pragma once
// Small host-level collectives over a Backend's point-to-point groups (NCCL on
// GPUs, mailboxes in the emulation): the broadcast plan, the per-rank figures
// and the self-check's outputs. Bytes go through device memory, as NCCL needs:
// one Staging buffer per run, reused by every call, and the root talks to one
// peer at a time, so device memory is one message, never P of them.
// Every rank must call them in the same order.
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "host/backend/backend.hpp"

namespace cpsched::gpu {

using Blob = std::vector<std::uint8_t>;

// The device buffer the collectives move bytes through. Sized once (from the
// plan: the largest message the run will send); a larger message frees it
// and allocates the larger size, so it is never more than one buffer.
class Staging {
 public:
  Staging(Backend& be, Bytes initial_bytes);
  ~Staging();
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // At least `n` bytes of device memory (n > 0), valid until the next call.
  void* get(Bytes n);
  Bytes capacity() const { return capacity_; }
  int allocations() const { return allocations_; }  // buffers allocated so far
  Backend& backend() const { return be_; }

 private:
  Backend& be_;
  void* ptr_ = nullptr;
  Bytes capacity_ = 0;
  int allocations_ = 0;
};

// Root 0 sends blobs[r] to rank r (blobs is read on rank 0 only; its own
// entry is returned without a transfer).
Blob scatter_from_root(Staging& st, const std::vector<Blob>* blobs);
// Every rank's blob, handed to `at_root(rank, blob)` on rank 0 one rank at a
// time in rank order (0 first); rank 0 never holds two ranks' blobs at once.
void gather_each_to_root(Staging& st, const Blob& mine, const std::function<void(Rank, const Blob&)>& at_root);
// Every rank's blob at rank 0 (index = rank); empty on the other ranks.
std::vector<Blob> gather_to_root(Staging& st, const Blob& mine);
// Rank 0's blob on every rank.
Blob broadcast_from_root(Staging& st, const Blob& root_blob);

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
