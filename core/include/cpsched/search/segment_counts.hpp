#pragma once
// How many tasks on rank r need segment s of head group g: the count the
// search's State asks about on every move. Dense (one counter per (segment,
// rank, group)) while that table is small; beyond it a hash table of the
// non-zero entries, whose size follows the placement (about the tasks' segment
// count), not segments x groups x ranks: at P = 1024 on a sparse mask the dense
// table would take gigabytes per start.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace cpsched::search {

class SegmentCounts {
 public:
  // Dense tables up to this many entries (2 bytes each).
  static constexpr std::size_t kDenseMaxEntries = std::size_t{1} << 24;

  // `expected`: about how many entries will be non-zero (sizes the hash table).
  void reset(std::size_t segments, int groups, int ranks, std::size_t expected);

  // The count (0 when absent).
  std::uint16_t get(std::int32_t s, int g, int r) const {
    const std::uint64_t k = key(s, g, r);
    if (dense_) return dense_counts_[static_cast<std::size_t>(k)];
    for (std::size_t i = home(k);; i = (i + 1) & mask_) {
      if (keys_[i] == k + 1) return counts_[i];
      if (keys_[i] == 0) return 0;
    }
  }
  // Adds `sign` (+1 or -1) and returns the count before.
  std::uint16_t bump(std::int32_t s, int g, int r, int sign) {
    std::uint16_t& c = slot(key(s, g, r));
    const std::uint16_t before = c;
    c = static_cast<std::uint16_t>(c + sign);
    return before;
  }
  bool dense() const { return dense_; }
  std::size_t memory_bytes() const;

 private:
  std::uint64_t key(std::int32_t s, int g, int r) const {
    return (static_cast<std::uint64_t>(s) * ranks_ + static_cast<std::uint64_t>(r)) * groups_ +
           static_cast<std::uint64_t>(g);
  }
  std::size_t home(std::uint64_t k) const {
    return static_cast<std::size_t>(((k + 1) * 0x9E3779B97F4A7C15ULL) >> shift_) & mask_;
  }
  std::uint16_t& slot(std::uint64_t k);
  void grow();

  bool dense_ = true;
  std::uint64_t groups_ = 1, ranks_ = 1;
  std::vector<std::uint16_t> dense_counts_;
  // Hash table: open addressing, linear probing; key + 1 (0: empty). Entries
  // are never removed (a count may drop to 0 and rise again).
  std::vector<std::uint64_t> keys_;
  std::vector<std::uint16_t> counts_;
  std::size_t mask_ = 0, used_ = 0;
  int shift_ = 0;
};

}  // namespace cpsched::search
