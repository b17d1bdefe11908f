#include "cpsched/search/segment_counts.hpp"

#include <algorithm>
#include <bit>

namespace cpsched::search {

void SegmentCounts::reset(std::size_t segments, int groups, int ranks, std::size_t expected) {
  groups_ = static_cast<std::uint64_t>(groups);
  ranks_ = static_cast<std::uint64_t>(ranks);
  const std::size_t entries = segments * static_cast<std::size_t>(groups) * static_cast<std::size_t>(ranks);
  dense_ = entries <= kDenseMaxEntries;
  if (dense_) {
    dense_counts_.assign(entries, 0);
    keys_ = {};
    counts_ = {};
    return;
  }
  dense_counts_ = {};
  // Load factor <= 1/2 at the expected size.
  const std::size_t cap = std::bit_ceil(std::max<std::size_t>(64, 2 * expected));
  keys_.assign(cap, 0);
  counts_.assign(cap, 0);
  mask_ = cap - 1;
  shift_ = 64 - std::countr_zero(cap);
  used_ = 0;
}

std::uint16_t& SegmentCounts::slot(std::uint64_t k) {
  if (dense_) return dense_counts_[static_cast<std::size_t>(k)];
  for (std::size_t i = home(k);; i = (i + 1) & mask_) {
    if (keys_[i] == k + 1) return counts_[i];
    if (keys_[i] == 0) {
      if (2 * (used_ + 1) > keys_.size() + keys_.size() / 2) {  // load > 3/4: grow, then insert
        grow();
        return slot(k);
      }
      keys_[i] = k + 1;
      ++used_;
      return counts_[i];
    }
  }
}

void SegmentCounts::grow() {
  std::vector<std::uint64_t> old_keys = std::move(keys_);
  std::vector<std::uint16_t> old_counts = std::move(counts_);
  const std::size_t cap = old_keys.size() * 2;
  keys_.assign(cap, 0);
  counts_.assign(cap, 0);
  mask_ = cap - 1;
  shift_ = 64 - std::countr_zero(cap);
  used_ = 0;
  for (std::size_t i = 0; i < old_keys.size(); ++i) {
    if (old_keys[i] == 0 || old_counts[i] == 0) continue;  // dropped-to-zero entries are not carried
    const std::uint64_t k = old_keys[i] - 1;
    std::size_t j = home(k);
    while (keys_[j] != 0) j = (j + 1) & mask_;
    keys_[j] = old_keys[i];
    counts_[j] = old_counts[i];
    ++used_;
  }
}

std::size_t SegmentCounts::memory_bytes() const {
  return dense_counts_.capacity() * sizeof(std::uint16_t) + keys_.capacity() * sizeof(std::uint64_t) +
         counts_.capacity() * sizeof(std::uint16_t);
}

}  // namespace cpsched::search
