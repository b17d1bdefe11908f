#include "collectives.hpp"

#include <algorithm>
#include <cstring>

namespace cpsched::gpu {

Staging::Staging(Backend& be, Bytes initial_bytes) : be_(be) {
  if (initial_bytes > 0) get(initial_bytes);
}

Staging::~Staging() {
  if (ptr_ == nullptr) return;
  try {
    be_.release(ptr_);
  } catch (...) {
    // A destructor must not throw; the backend frees it when it dies.
  }
}

void* Staging::get(Bytes n) {
  if (n <= capacity_) return ptr_;
  if (ptr_ != nullptr) be_.release(ptr_);
  ptr_ = nullptr;
  capacity_ = 0;
  ptr_ = be_.alloc(n);
  capacity_ = n;
  ++allocations_;
  return ptr_;
}

namespace {

// Every rank's message size (fixed 8 bytes each), in one group: to the root
// (gather: out[r] at rank 0) or from it (scatter: out[me] at rank me).
std::vector<std::uint64_t> exchange_sizes(Staging& st, bool to_root, const std::vector<std::uint64_t>& root_sizes,
                                          std::uint64_t mine) {
  Backend& be = st.backend();
  const int P = be.world();
  const Rank me = be.rank();
  std::vector<std::uint64_t> out(static_cast<std::size_t>(P), 0);
  auto* dev = static_cast<std::uint64_t*>(st.get(8 * static_cast<Bytes>(P)));
  std::vector<P2POp> ops;
  if (me == 0) {
    if (!to_root) be.upload(dev, root_sizes.data(), 8 * static_cast<Bytes>(P));
    for (Rank r = 1; r < P; ++r) ops.push_back({!to_root, r, dev + r, 8});
  } else {
    if (to_root) be.upload(dev, &mine, 8);
    ops.push_back({to_root, 0, dev, 8});
  }
  be.exchange(ops);
  be.synchronize();
  if (me == 0 && to_root) be.download(out.data(), dev, 8 * static_cast<Bytes>(P));
  if (me != 0 && !to_root) be.download(&out[static_cast<std::size_t>(me)], dev, 8);
  return out;
}

}  // namespace

Blob scatter_from_root(Staging& st, const std::vector<Blob>* blobs) {
  Backend& be = st.backend();
  const int P = be.world();
  const Rank me = be.rank();
  if (P == 1) return blobs != nullptr && !blobs->empty() ? (*blobs)[0] : Blob{};
  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(P), 0);
  if (me == 0)
    for (Rank r = 0; r < P; ++r) sizes[static_cast<std::size_t>(r)] = (*blobs)[static_cast<std::size_t>(r)].size();
  const std::vector<std::uint64_t> got = exchange_sizes(st, false, sizes, 0);
  if (me == 0) {
    // One peer at a time through the one buffer: upload, send, drain.
    for (Rank r = 1; r < P; ++r) {
      const Blob& b = (*blobs)[static_cast<std::size_t>(r)];
      if (b.empty()) continue;
      void* dev = st.get(static_cast<Bytes>(b.size()));
      be.upload(dev, b.data(), static_cast<Bytes>(b.size()));
      be.exchange({{true, r, dev, static_cast<Bytes>(b.size())}});
      be.synchronize();
    }
    return (*blobs)[0];
  }
  Blob mine(got[static_cast<std::size_t>(me)]);
  if (mine.empty()) return mine;
  void* dev = st.get(static_cast<Bytes>(mine.size()));
  be.exchange({{false, 0, dev, static_cast<Bytes>(mine.size())}});
  be.download(mine.data(), dev, static_cast<Bytes>(mine.size()));
  return mine;
}

void gather_each_to_root(Staging& st, const Blob& mine, const std::function<void(Rank, const Blob&)>& at_root) {
  Backend& be = st.backend();
  const int P = be.world();
  const Rank me = be.rank();
  if (P == 1) {
    at_root(0, mine);
    return;
  }
  const std::vector<std::uint64_t> sizes = exchange_sizes(st, true, {}, mine.size());
  if (me != 0) {
    if (!mine.empty()) {
      void* dev = st.get(static_cast<Bytes>(mine.size()));
      be.upload(dev, mine.data(), static_cast<Bytes>(mine.size()));
      be.exchange({{true, 0, dev, static_cast<Bytes>(mine.size())}});
      be.synchronize();
    }
    return;
  }
  at_root(0, mine);
  Blob b;
  for (Rank r = 1; r < P; ++r) {
    b.assign(sizes[static_cast<std::size_t>(r)], 0);
    if (!b.empty()) {
      void* dev = st.get(static_cast<Bytes>(b.size()));
      be.exchange({{false, r, dev, static_cast<Bytes>(b.size())}});
      be.download(b.data(), dev, static_cast<Bytes>(b.size()));
    }
    at_root(r, b);
  }
}

std::vector<Blob> gather_to_root(Staging& st, const Blob& mine) {
  std::vector<Blob> all;
  gather_each_to_root(st, mine, [&](Rank, const Blob& b) { all.push_back(b); });
  return all;
}

Blob broadcast_from_root(Staging& st, const Blob& root_blob) {
  if (st.backend().rank() != 0) return scatter_from_root(st, nullptr);
  std::vector<Blob> blobs(static_cast<std::size_t>(st.backend().world()), root_blob);
  return scatter_from_root(st, &blobs);
}

}  // namespace cpsched::gpu
