#pragma once
// Orderable integer images of doubles, so hot sorts work on integers.
#include <bit>
#include <cstdint>
#include <utility>
#include <vector>

namespace cpsched::bg {

// ascending_key(x) < ascending_key(y) iff x < y (for non-NaN x, y; -0 == +0).
inline std::uint64_t ascending_key(double x) {
  const auto u = std::bit_cast<std::uint64_t>(x + 0.0);  // -0.0 + 0.0 == +0.0
  return (u >> 63) != 0 ? ~u : u | (std::uint64_t{1} << 63);
}
inline std::uint64_t descending_key(double x) { return ~ascending_key(x); }

// A (primary, secondary) integer key, ordered lexicographically.
struct KeyPair {
  std::uint64_t a = 0;
  std::uint64_t b = 0;
  friend bool operator<(const KeyPair& x, const KeyPair& y) { return x.a != y.a ? x.a < y.a : x.b < y.b; }
};

// Stable LSD radix sort of items by their 64-bit keys, ascending, in six
// 11-bit digits. A digit on which all keys agree costs no pass.
// `keys` and `items` are parallel; the scratch vectors are reused storage.
template <class T>
void radix_sort_stable(std::vector<std::uint64_t>& keys, std::vector<T>& items, std::vector<std::uint64_t>& key_tmp,
                       std::vector<T>& item_tmp, std::vector<std::uint32_t>& count) {
  constexpr int kBits = 11, kDigits = 6;
  constexpr std::size_t kBuckets = std::size_t{1} << kBits;
  const std::size_t n = keys.size();
  if (n < 2) return;
  count.assign(kBuckets * kDigits, 0);
  for (const std::uint64_t k : keys)
    for (int d = 0; d < kDigits; ++d) ++count[static_cast<std::size_t>(d) * kBuckets + ((k >> (kBits * d)) & (kBuckets - 1))];
  key_tmp.resize(n);
  item_tmp.resize(n);
  for (int d = 0; d < kDigits; ++d) {
    std::uint32_t* c = count.data() + static_cast<std::size_t>(d) * kBuckets;
    const int shift = kBits * d;
    if (c[(keys[0] >> shift) & (kBuckets - 1)] == n) continue;  // every key has this digit
    std::uint32_t sum = 0;
    for (std::size_t b = 0; b < kBuckets; ++b) {
      const std::uint32_t v = c[b];
      c[b] = sum;
      sum += v;
    }
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t to = c[(keys[i] >> shift) & (kBuckets - 1)]++;
      key_tmp[to] = keys[i];
      item_tmp[to] = std::move(items[i]);
    }
    keys.swap(key_tmp);
    items.swap(item_tmp);
  }
}

}  // namespace cpsched::bg
