#pragma once
// Device-side counting of a token top-k selection: an int32 [S, H, k] index
// tensor resident in device memory (-1 padded, FlashMLA / DSA layout) and the
// block bounds of a sharding become the grid's cells (index_cells.hpp): per
// (head, q block, k block) the selected pairs, the needed rows (queries with
// any selected key in the cell) and the needed cols (the distinct selected
// keys), exact, with no copy of the indices to the host. Four CTA programs
// (Exec contract of attention_programs.hpp), following mask_ingest.hpp's
// count / scan / emit:
//   1. TopkMark:  one thread per (query, head) row: each valid key adds to its
//      cell's area (a run of keys in one k block is one integer atomic), sets
//      its bit in the (head, q block) key bitmap and the query's bit in the
//      (head, k block) query bitmap. Integer sums and bit ORs commute, so the
//      result does not depend on the thread order. A key outside [0, S), or
//      after its query with `causal`, records its flat position (atomic min:
//      the first bad entry, deterministic) instead.
//   2. TopkRunCount: one thread per cell: the maximal runs of set bits of its
//      query bitmap inside the q block (rows) and of its key bitmap inside
//      the k block (cols);
//   3. IngestScan (mask_ingest.hpp): offsets of each cell's runs;
//   4. TopkRunEmit: the runs, rows then cols, at the cell's offset.
// Cells come in (head, q block, k block) order, runs ascending: the result is
// deterministic and equals count_index_cells. Duplicate keys in a row are not
// detected here (IndexMask::validate on the host does): a duplicate would be
// counted twice in the area. Scratch: two bitmaps of cell_heads x nb x S bits.
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "cpsched/mask/index/cells.hpp"
#include "mask_ingest.hpp"

namespace cpsched::gpu {

CPSCHED_HD inline void atomic_or_u32(std::uint32_t* p, std::uint32_t v) {
#if defined(__CUDA_ARCH__)
  atomicOr(reinterpret_cast<unsigned int*>(p), static_cast<unsigned int>(v));
#else
  *p |= v;  // the CPU twin runs one thread at a time
#endif
}

CPSCHED_HD inline void atomic_min_i64(i64* p, i64 v) {
#if defined(__CUDA_ARCH__)
  atomicMin(reinterpret_cast<long long*>(p), static_cast<long long>(v));
#else
  if (v < *p) *p = v;
#endif
}

// Index of the lowest set bit of x != 0.
CPSCHED_HD inline int lowest_bit(std::uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __ffs(static_cast<int>(x)) - 1;
#else
  return __builtin_ctz(x);
#endif
}

// Calls f(b, e) for every maximal run [b, e) of set bits of `bits` inside
// [lo, hi), in ascending order; whole zero or one words are skipped at once.
template <class F>
CPSCHED_HD inline void for_each_run(const std::uint32_t* bits, i64 lo, i64 hi, F&& f) {
  i64 x = lo;
  while (x < hi) {
    i64 w = x >> 5;
    std::uint32_t word = bits[w] & (~0u << (x & 31));
    while (word == 0) {
      if (++w * 32 >= hi) return;
      word = bits[w];
    }
    const i64 b = w * 32 + lowest_bit(word);
    if (b >= hi) return;
    w = b >> 5;
    word = ~bits[w] & (~0u << (b & 31));
    while (word == 0) {
      if (++w * 32 >= hi) break;
      word = ~bits[w];
    }
    const i64 e = word == 0 ? hi : hd_min<i64>(hi, w * 32 + lowest_bit(word));
    f(b, e);
    x = e;
  }
}

// What every program reads and writes (device pointers on the GPU).
struct TopkCount {
  const std::int32_t* idx;  // [S, H, k]
  i64 S;
  std::int32_t H, k;
  std::int32_t causal;
  std::int32_t cell_heads;  // H (a cell per head) or 1 (heads merged)
  const i64* bounds;        // nb + 1 block bounds
  std::int32_t nb;
  std::int32_t pad;
  i64 words;                // 32-bit words of one bitmap row: ceil(S / 32)
  i64* area;                // [cell_heads, nb, nb], zeroed
  std::uint32_t* col_bits;  // [cell_heads, nb (q block), words]: selected keys, zeroed
  std::uint32_t* row_bits;  // [cell_heads, nb (k block), words]: queries with a key there, zeroed
  i64* bad;                 // first invalid entry's flat position; starts at kNoBadEntry

  CPSCHED_HD i64 cells() const { return static_cast<i64>(cell_heads) * nb * nb; }
};

inline constexpr i64 kNoBadEntry = std::numeric_limits<i64>::max();

struct TopkMark {
  static constexpr int kThreads = kDataThreads;
  using State = NoState;
  struct Smem {};
  TopkCount c;

  template <class Exec>
  CPSCHED_HD void operator()(Exec& ex, int bx, int, Smem&) const {
    ex.each([&](int t, State&) {
      const i64 item = static_cast<i64>(bx) * kThreads + t;  // row (query i, head h)
      if (item >= c.S * c.H) return;
      const i64 i = item / c.H;
      const int ch = c.cell_heads == 1 ? 0 : static_cast<int>(item % c.H);
      const int qb = block_of(c.bounds, c.nb, i);
      const i64 hi = c.causal != 0 ? i + 1 : c.S;
      const std::int32_t* keys = c.idx + item * c.k;
      std::uint32_t* cols = c.col_bits + (static_cast<i64>(ch) * c.nb + qb) * c.words;
      i64* area = c.area + (static_cast<i64>(ch) * c.nb + qb) * c.nb;
      int run_kb = -1;
      i64 run = 0;
      auto flush = [&] {
        if (run == 0) return;
        atomic_add_i64(area + run_kb, run);
        atomic_or_u32(c.row_bits + (static_cast<i64>(ch) * c.nb + run_kb) * c.words + (i >> 5), 1u << (i & 31));
      };
      for (int j = 0; j < c.k; ++j) {
        const i64 v = keys[j];
        if (v == -1) continue;
        if (v < 0 || v >= hi) {
          atomic_min_i64(c.bad, item * c.k + j);
          continue;
        }
        atomic_or_u32(cols + (v >> 5), 1u << (v & 31));
        const int kb = block_of(c.bounds, c.nb, v);
        if (kb != run_kb) {
          flush();
          run_kb = kb;
          run = 0;
        }
        ++run;
      }
      flush();
    });
  }
};

// Per cell: row runs + col runs into counts[cell] (the scan's input), row runs alone into row_runs[cell].
struct TopkRunCount {
  static constexpr int kThreads = kDataThreads;
  using State = NoState;
  struct Smem {};
  TopkCount c;
  i64* counts;    // cells + 1
  i64* row_runs;  // cells

  template <class Exec>
  CPSCHED_HD void operator()(Exec& ex, int bx, int, Smem&) const {
    ex.each([&](int t, State&) {
      const i64 cell = static_cast<i64>(bx) * kThreads + t;
      if (cell >= c.cells()) return;
      i64 nr = 0, nc = 0;
      if (c.area[cell] > 0) {
        const i64 ch = cell / (static_cast<i64>(c.nb) * c.nb);
        const int qb = static_cast<int>(cell / c.nb % c.nb), kb = static_cast<int>(cell % c.nb);
        for_each_run(c.row_bits + (ch * c.nb + kb) * c.words, c.bounds[qb], c.bounds[qb + 1], [&](i64, i64) { ++nr; });
        for_each_run(c.col_bits + (ch * c.nb + qb) * c.words, c.bounds[kb], c.bounds[kb + 1], [&](i64, i64) { ++nc; });
      }
      row_runs[cell] = nr;
      counts[cell] = nr + nc;
    });
  }
};

struct TopkRunEmit {
  static constexpr int kThreads = kDataThreads;
  using State = NoState;
  struct Smem {};
  TopkCount c;
  const i64* offsets;  // from IngestScan
  Iv* runs;

  template <class Exec>
  CPSCHED_HD void operator()(Exec& ex, int bx, int, Smem&) const {
    ex.each([&](int t, State&) {
      const i64 cell = static_cast<i64>(bx) * kThreads + t;
      if (cell >= c.cells() || c.area[cell] == 0) return;
      const i64 ch = cell / (static_cast<i64>(c.nb) * c.nb);
      const int qb = static_cast<int>(cell / c.nb % c.nb), kb = static_cast<int>(cell % c.nb);
      i64 at = offsets[cell];
      auto put = [&](i64 b, i64 e) { runs[at++] = Iv{b, e}; };
      for_each_run(c.row_bits + (ch * c.nb + kb) * c.words, c.bounds[qb], c.bounds[qb + 1], put);
      for_each_run(c.col_bits + (ch * c.nb + qb) * c.words, c.bounds[kb], c.bounds[kb + 1], put);
    });
  }
};

// What the programs leave, copied back: O(cells + runs) numbers.
struct TopkCountRaw {
  std::vector<i64> area;      // [cell_heads, nb, nb]
  std::vector<i64> row_runs;  // [cells]
  std::vector<i64> offsets;   // [cells + 1]
  std::vector<Iv> runs;
  i64 bad = kNoBadEntry;
  std::int32_t bad_value = 0;  // idx at `bad`
};

// The selection's dimensions and the sharding's blocks (tiling [0, S)).
struct TopkDims {
  i64 seqlen = 0;
  int heads = 1;     // H of the index tensor
  int k = 0;
  bool causal = true;
  bool per_head = true;  // a cell per head, else heads merged (count_index_cells' per_head)
};

// Checks dims and blocks (throws cpsched::Error naming what is wrong) and
// returns the block bounds.
std::vector<i64> topk_count_bounds(const TopkDims& d, const std::vector<Range>& blocks);
// The non-empty cells from the programs' results, sorted by (head, qblock,
// kblock), or cpsched::Error naming the first bad entry as IndexMask::validate
// does ("<source>: indices[i, h, j] = v is outside [0, S)" / "selects a key
// after query i (causal: true)").
std::vector<IndexCell> topk_cells_from_raw(const TopkCountRaw& raw, const TopkDims& d, int nb,
                                           const std::string& source);
// The CPU twin: the four programs on host memory (run_on_host).
std::vector<IndexCell> count_topk_on_host(std::span<const std::int32_t> idx, const TopkDims& d,
                                          const std::vector<Range>& blocks, const std::string& source);

}  // namespace cpsched::gpu
