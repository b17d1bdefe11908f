#include "cpsched/plan/index_pool.hpp"

#include <algorithm>

namespace cpsched {

IndexPool::IndexPool(std::vector<std::int32_t> entries) : size_(entries.size()) {
  if (size_ == 0) return;
  // The vector is kept as it is; the pool points into it (no copy).
  auto owner = std::make_shared<const std::vector<std::int32_t>>(std::move(entries));
  data_ = std::shared_ptr<const std::int32_t[]>(owner, owner->data());
}

bool operator==(const IndexPool& a, const IndexPool& b) {
  return a.shares(b) || std::equal(a.begin(), a.end(), b.begin(), b.end());
}

}  // namespace cpsched
