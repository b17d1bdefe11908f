#include "cpsched/base/buffer_recycler.hpp"

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

namespace cpsched {

struct BufferRecycler::Shelf {
  struct Idle {
    std::unique_ptr<std::int32_t[]> data;
    std::size_t size = 0;
  };
  mutable std::mutex mu;
  std::size_t keep = 0;
  std::vector<Idle> idle;  // by size, ascending

  void put(std::int32_t* data, std::size_t size) {
    std::unique_ptr<std::int32_t[]> owned(data);
    std::lock_guard lock(mu);
    if (keep == 0) return;
    const auto at = std::lower_bound(idle.begin(), idle.end(), size, [](const Idle& x, std::size_t n) { return x.size < n; });
    idle.insert(at, Idle{std::move(owned), size});
    if (idle.size() > keep) idle.erase(idle.begin());  // the smallest: the likeliest too small next time
  }
};

BufferRecycler::BufferRecycler(std::size_t keep) : shelf_(std::make_shared<Shelf>()) {
  shelf_->keep = keep;
  shelf_->idle.reserve(keep + 1);  // put() runs in a deleter: it must not allocate (or throw)
}

BufferRecycler::~BufferRecycler() = default;

std::shared_ptr<std::int32_t[]> BufferRecycler::take(std::size_t n) {
  std::unique_ptr<std::int32_t[]> data;
  std::size_t size = n;
  {
    std::lock_guard lock(shelf_->mu);
    auto& idle = shelf_->idle;
    const auto at = std::lower_bound(idle.begin(), idle.end(), n, [](const Shelf::Idle& x, std::size_t m) { return x.size < m; });
    if (at != idle.end()) {
      data = std::move(at->data);
      size = at->size;
      idle.erase(at);
    }
  }
  // Not zero-filled: the callers write what they read (a fill would be a pass of its own).
  if (!data) data = std::make_unique_for_overwrite<std::int32_t[]>(n);
  // The deleter holds the shelf weakly: a buffer outliving its recycler is freed.
  return std::shared_ptr<std::int32_t[]>(data.release(), [shelf = std::weak_ptr<Shelf>(shelf_), size](std::int32_t* p) {
    if (const auto s = shelf.lock()) s->put(p, size);
    else delete[] p;
  });
}

std::size_t BufferRecycler::idle() const {
  std::lock_guard lock(shelf_->mu);
  return shelf_->idle.size();
}

std::size_t BufferRecycler::idle_entries() const {
  std::lock_guard lock(shelf_->mu);
  std::size_t n = 0;
  for (const Shelf::Idle& x : shelf_->idle) n += x.size;
  return n;
}

std::shared_ptr<std::int32_t[]> take_buffer(BufferRecycler* r, std::size_t n) {
  if (r != nullptr) return r->take(n);
  return std::shared_ptr<std::int32_t[]>(std::make_unique_for_overwrite<std::int32_t[]>(n));
}

}  // namespace cpsched
