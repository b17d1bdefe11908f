#pragma once
// The rows of a pass's index args (CalcMeta::indices, plan.hpp): an immutable
// int32 array that copies share. A rank's pool of a DSA layer holds tens of
// MiB, and the backward description is often the forward one (same stage
// cut): sharing makes that copy free. Reads like a const std::vector; a pool
// is made whole, never changed in place (to change entries, copy them out
// and make a new pool).
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <vector>

namespace cpsched {

class IndexPool {
 public:
  using value_type = std::int32_t;
  using const_iterator = const std::int32_t*;

  IndexPool() = default;
  explicit IndexPool(std::vector<std::int32_t> entries);
  IndexPool(std::initializer_list<std::int32_t> entries) : IndexPool(std::vector<std::int32_t>(entries)) {}
  // The first `size` entries of `store`, which the pool then shares (the
  // plan builder's buffers, written before the pool is made).
  IndexPool(std::shared_ptr<const std::int32_t[]> store, std::size_t size)
      : data_(size == 0 ? nullptr : std::move(store)), size_(size) {}

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const std::int32_t* data() const { return data_.get(); }
  const std::int32_t& operator[](std::size_t i) const { return data_[i]; }
  const std::int32_t* begin() const { return data_.get(); }
  const std::int32_t* end() const { return data_.get() + size_; }
  std::span<const std::int32_t> span() const { return {data_.get(), size_}; }
  std::vector<std::int32_t> to_vector() const { return {begin(), end()}; }
  // True when both share one array (a copy of the other), not only equal entries.
  bool shares(const IndexPool& o) const { return data_ == o.data_ && size_ == o.size_; }

  // Equal entries (shared arrays compare in O(1)).
  friend bool operator==(const IndexPool& a, const IndexPool& b);

 private:
  std::shared_ptr<const std::int32_t[]> data_;
  std::size_t size_ = 0;
};

}  // namespace cpsched
