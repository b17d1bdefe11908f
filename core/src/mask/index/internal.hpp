#pragma once
// Shared pieces of the index-mask code (index_mask.cpp, index_cells.cpp,
// index_blocks.cpp): threads, the shape checks, the per-row entry checks and
// their error messages. Not installed.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "cpsched/mask/index/cells.hpp"
#include "cpsched/mask/index/index_mask.hpp"

namespace cpsched::index_detail {

int resolve_threads(int threads);

// Runs fn(t) for t in [0, n) on up to n threads (base/parallel_for.hpp: the
// caller's among them; the exception of the lowest t is rethrown).
void run_threads(int n, const std::function<void(int)>& fn);

std::string shape_string(const std::vector<std::int64_t>& shape);
// "src" or "<name>" when the array has no source.
std::string source_of(const IndexArray& a, const char* name);

// The checks of IndexMask::validate() that need no pass over the entries:
// S, kv_heads, block sizes, shapes, and for bsr the indptr arrays.
void check_structure(const IndexMask& m);

// The first offending entry over all threads: each thread keeps its first,
// the smallest position wins, so the error does not depend on the threads.
struct FirstError {
  std::atomic<std::int64_t> pos{std::numeric_limits<std::int64_t>::max()};
  std::vector<std::pair<std::int64_t, std::string>> found;  // one slot per thread
  explicit FirstError(int threads) : found(static_cast<std::size_t>(threads), {std::numeric_limits<std::int64_t>::max(), {}}) {}
  void report(int t, std::int64_t p, std::string msg) {
    found[static_cast<std::size_t>(t)] = {p, std::move(msg)};
    std::int64_t cur = pos.load(std::memory_order_relaxed);
    while (p < cur && !pos.compare_exchange_weak(cur, p, std::memory_order_relaxed)) {
    }
  }
  // True when an error before `p` is already known (the thread may stop).
  bool before(std::int64_t p) const { return pos.load(std::memory_order_relaxed) < p; }
  void rethrow() const;
};

// A bitmap over [0, n) bits.
struct Bits {
  std::vector<std::uint64_t> w;
  void resize(std::int64_t n) { w.assign(static_cast<std::size_t>((n + 63) / 64), 0); }
  bool test_set(std::int64_t i) {
    std::uint64_t& x = w[static_cast<std::size_t>(i >> 6)];
    const std::uint64_t b = std::uint64_t{1} << (i & 63);
    const bool was = (x & b) != 0;
    x |= b;
    return was;
  }
  void set(std::int64_t i) { w[static_cast<std::size_t>(i >> 6)] |= std::uint64_t{1} << (i & 63); }
  void clear(std::int64_t i) { w[static_cast<std::size_t>(i >> 6)] &= ~(std::uint64_t{1} << (i & 63)); }
  bool test(std::int64_t i) const { return (w[static_cast<std::size_t>(i >> 6)] >> (i & 63)) & 1; }
};

// The keys of one row, by row stamps: no clearing after a row (one store
// per key instead of a set and a clear); the stamps restart every 255 rows.
struct RowStamps {
  std::vector<std::uint8_t> s;
  std::uint8_t e = 0;
  void resize(std::int64_t n) { s.assign(static_cast<std::size_t>(n), 0), e = 0; }
  void next_row() {
    if (++e == 0) {
      std::fill(s.begin(), s.end(), 0);
      e = 1;
    }
  }
  bool test_set(std::int64_t v) {
    std::uint8_t& x = s[static_cast<std::size_t>(v)];
    const bool was = x == e;
    x = e;
    return was;
  }
};

// Checks row (i, h) of a topk mask: every entry -1 or in [0, S), key <= i
// when causal, no key twice. Calls on_entry(v) for the valid entries before
// the first bad one; returns the j of the first bad entry, or -1; sets
// `increasing` to whether the row's keys were strictly increasing.
// kBitmap = false suits sorted rows (the usual layout): an increasing row
// has no duplicates, so it needs no bitmap (others fall back to one).
// kBitmap = true suits rows in any order: `seen` catches duplicates in the
// same pass. Either way `seen` is left clear.
// (With RowStamps as `seen`, kBitmap = true, the caller starts each row with
// next_row() and nothing needs clearing.)
template <bool kBitmap, class Seen, class OnEntry>
inline std::int64_t scan_topk_row(const std::int32_t* row, std::int64_t k, std::int64_t i, std::int64_t S, bool causal,
                                  Seen& seen, OnEntry&& on_entry, bool& increasing) {
  const auto hi = static_cast<std::uint64_t>(causal ? std::min<std::int64_t>(i + 1, S) : S);  // keys must be < hi
  std::int64_t bad = -1, prev = -1, j = 0;
  increasing = true;
  for (; j < k; ++j) {
    const std::int64_t v = row[j];
    if (v == -1) continue;
    // One unsigned compare covers both ends (negative wraps to large).
    if (static_cast<std::uint64_t>(v) >= hi || (kBitmap && seen.test_set(v))) {
      bad = j;
      break;
    }
    increasing &= v > prev;
    prev = v;
    on_entry(v);
  }
  if constexpr (kBitmap) {
    if constexpr (std::is_same_v<Seen, Bits>)
      for (std::int64_t x = 0; x < j; ++x)
        if (row[x] >= 0) seen.clear(row[x]);
    return bad;
  } else {
    if (increasing && bad < 0) return -1;
    // Duplicates before the first range error (it is the first bad entry
    // only when no duplicate comes earlier).
    const std::int64_t end = bad >= 0 ? bad : k;
    std::int64_t d = 0, dup = -1;
    for (; d < end; ++d) {
      if (row[d] == -1) continue;
      if (seen.test_set(row[d])) {
        dup = d;
        break;
      }
    }
    for (std::int64_t x = 0; x < d; ++x)
      if (row[x] >= 0) seen.clear(row[x]);
    return dup >= 0 ? dup : bad;
  }
}

// The error for entry j of row (i, h) found bad by check_topk_row. i is the
// query token; the array's first row is query token `row0` (a rank's rows,
// summary.hpp: the message then gives both the array's row and the token).
std::string topk_entry_error(const IndexMask& m, std::int64_t i, std::int64_t h, std::int64_t j, std::int64_t row0 = 0);

// The shape and data checks of one array (no negative dimension, data present).
void check_array_data(const IndexArray& a, const char* name);

// count_index_cells' checks of `blocks`: they tile [0, S) in order.
void check_blocks(const std::vector<Range>& blocks, Token S);
// count_index_cells over the query blocks [qb0, qb1) (the mask's structure
// and the blocks checked by the caller), whose rows the mask's array holds
// from query token row0 on: the cells of those query blocks, sorted by
// (head, qblock, kblock), their entries validated.
std::vector<IndexCell> count_cells(const IndexMask& mask, Token row0, std::int64_t qb0, std::int64_t qb1,
                                   const std::vector<Range>& blocks, IndexCountOptions options);

// Validates the entries of a topk mask (no counting).
void validate_topk_entries(const IndexMask& m, int threads);
// Validates the entries of a block_topk or bsr mask.
void validate_block_entries(const IndexMask& m, int threads);

// Key block range of block kb and query block range of qb.
inline Range key_block(const IndexMask& m, std::int64_t kb) {
  return {kb * m.block_k, std::min<Token>(m.seqlen, (kb + 1) * m.block_k)};
}
inline Range query_block(const IndexMask& m, std::int64_t qb) {
  return {qb * m.block_q, std::min<Token>(m.seqlen, (qb + 1) * m.block_q)};
}
inline std::int64_t num_key_blocks(const IndexMask& m) { return (m.seqlen + m.block_k - 1) / m.block_k; }

// Pairs (q, k) of q x k with k <= q (token diagonal).
inline Token causal_pairs(Range q, Range k) {
  if (q.empty() || k.empty()) return 0;
  // Row r sees clamp(r + 1 - k.begin, 0, |k|) keys: zero below k.begin, a
  // ramp until k.end - 1, then all.
  Token total = 0;
  const Token ramp_a = std::max(q.begin, k.begin), ramp_b = std::min(q.end, k.end - 1);
  if (ramp_b > ramp_a) {
    const Token first = ramp_a + 1 - k.begin, last = ramp_b - k.begin;  // counts at ramp_a and ramp_b - 1
    total += (first + last) * (ramp_b - ramp_a) / 2;
  }
  const Token full_a = std::max(q.begin, k.end - 1);
  if (q.end > full_a) total += (q.end - full_a) * k.size();
  return total;
}

// The selected key blocks of row (h, qb) of a block mask, as lists: for
// block_topk the row's non-(-1) entries; for bsr the partial list, and the
// full list when given.
struct BlockRows {
  const IndexMask& m;
  std::vector<std::int64_t> base;       // per head: offset of the head's slice of indices
  std::vector<std::int64_t> full_base;  // same for full_indices
  explicit BlockRows(const IndexMask& mask);
  std::int64_t rows() const { return static_cast<std::int64_t>(m.kv_heads) * m.num_query_blocks(); }
  // [begin, end) positions into `indices` (bsr) or the row's slots (block_topk).
  std::pair<std::int64_t, std::int64_t> partial(std::int64_t h, std::int64_t qb) const;
  std::pair<std::int64_t, std::int64_t> full(std::int64_t h, std::int64_t qb) const;
  std::int64_t indptr_at(const IndexArray& a, std::int64_t h, std::int64_t x) const {
    const std::int64_t w = m.num_query_blocks() + 1;
    return a.data[(a.shape.size() == 1 ? 0 : h * w) + x];
  }
};

}  // namespace cpsched::index_detail
