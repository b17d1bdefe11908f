#include "collectives.hpp"

#include <cstring>

namespace cpsched::gpu {

namespace {

// Sizes first (fixed 8 bytes), then payloads: two groups.
std::vector<std::uint64_t> exchange_sizes(Backend& be, bool to_root, const std::vector<std::uint64_t>& root_sizes,
                                          std::uint64_t mine) {
  const int P = be.world();
  const Rank me = be.rank();
  std::vector<std::uint64_t> out(static_cast<std::size_t>(P), 0);
  auto* dev = static_cast<std::uint64_t*>(be.alloc(8 * static_cast<Bytes>(P)));
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

Blob scatter_from_root(Backend& be, const std::vector<Blob>* blobs) {
  const int P = be.world();
  const Rank me = be.rank();
  if (P == 1) return blobs != nullptr && !blobs->empty() ? (*blobs)[0] : Blob{};
  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(P), 0);
  if (me == 0)
    for (Rank r = 0; r < P; ++r) sizes[static_cast<std::size_t>(r)] = (*blobs)[static_cast<std::size_t>(r)].size();
  const std::vector<std::uint64_t> got = exchange_sizes(be, false, sizes, 0);
  if (me != 0) sizes = got;
  std::vector<P2POp> ops;
  Blob mine;
  if (me == 0) {
    for (Rank r = 1; r < P; ++r) {
      const Blob& b = (*blobs)[static_cast<std::size_t>(r)];
      if (b.empty()) continue;
      void* dev = be.alloc(static_cast<Bytes>(b.size()));
      be.upload(dev, b.data(), static_cast<Bytes>(b.size()));
      ops.push_back({true, r, dev, static_cast<Bytes>(b.size())});
    }
    be.exchange(ops);
    be.synchronize();
    return (*blobs)[0];
  }
  mine.resize(sizes[static_cast<std::size_t>(me)]);
  if (mine.empty()) return mine;
  void* dev = be.alloc(static_cast<Bytes>(mine.size()));
  ops.push_back({false, 0, dev, static_cast<Bytes>(mine.size())});
  be.exchange(ops);
  be.download(mine.data(), dev, static_cast<Bytes>(mine.size()));
  return mine;
}

std::vector<Blob> gather_to_root(Backend& be, const Blob& mine) {
  const int P = be.world();
  const Rank me = be.rank();
  if (P == 1) return {mine};
  const std::vector<std::uint64_t> sizes = exchange_sizes(be, true, {}, mine.size());
  std::vector<P2POp> ops;
  if (me != 0) {
    if (!mine.empty()) {
      void* dev = be.alloc(static_cast<Bytes>(mine.size()));
      be.upload(dev, mine.data(), static_cast<Bytes>(mine.size()));
      ops.push_back({true, 0, dev, static_cast<Bytes>(mine.size())});
    }
    be.exchange(ops);
    be.synchronize();
    return {};
  }
  std::vector<Blob> all(static_cast<std::size_t>(P));
  all[0] = mine;
  std::vector<void*> dev(static_cast<std::size_t>(P), nullptr);
  for (Rank r = 1; r < P; ++r) {
    const auto n = sizes[static_cast<std::size_t>(r)];
    all[static_cast<std::size_t>(r)].resize(n);
    if (n == 0) continue;
    dev[static_cast<std::size_t>(r)] = be.alloc(static_cast<Bytes>(n));
    ops.push_back({false, r, dev[static_cast<std::size_t>(r)], static_cast<Bytes>(n)});
  }
  be.exchange(ops);
  for (Rank r = 1; r < P; ++r)
    if (!all[static_cast<std::size_t>(r)].empty())
      be.download(all[static_cast<std::size_t>(r)].data(), dev[static_cast<std::size_t>(r)],
                  static_cast<Bytes>(all[static_cast<std::size_t>(r)].size()));
  return all;
}

Blob broadcast_from_root(Backend& be, const Blob& root_blob) {
  if (be.rank() != 0) return scatter_from_root(be, nullptr);
  std::vector<Blob> blobs(static_cast<std::size_t>(be.world()), root_blob);
  return scatter_from_root(be, &blobs);
}

}  // namespace cpsched::gpu
