#pragma once
// Device-side mask ingestion: a range mask held in device memory (DevSlice
// array) and the block boundaries of a sharding become the grid's cell areas
// and the needed rows/cols of every (slice, cell) pair, with no per-token
// work and no copy of the mask to the host (the first step of the seed's
// "device-side solver"). Three programs (Exec contract of
// attention_programs.hpp):
//   1. IngestCount: per slice, the cells of its bounding box in the grid;
//   2. IngestScan:  one CTA, exclusive prefix sum of the counts (record offsets);
//   3. IngestEmit:  per slice, one record per bounding-box cell (area 0 when the
//      slice misses the cell) at its offset, and the area added to the cell.
// Records come in slice order, then cell order: the result is deterministic.
// `cells_from_records` (host) folds them into per-cell row/col sets.
#include <vector>

#include "cpsched/mask/mask.hpp"
#include "cpsched/problem/problem.hpp"
#include "data_programs.hpp"

namespace cpsched::gpu {

struct CellRecord {
  std::int32_t qblock;
  std::int32_t kblock;
  i64 area;
  Iv rows;  // needed rows of the slice in the cell (global tokens)
  Iv cols;
};

// Block of token x: the last b with bounds[b] <= x (bounds: nb + 1 entries).
CPSCHED_HD inline int block_of(const i64* bounds, int nb, i64 x) {
  int lo = 0, hi = nb - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (bounds[mid] <= x) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

CPSCHED_HD inline void atomic_add_i64(i64* p, i64 v) {
#if defined(__CUDA_ARCH__)
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
#else
  *p += v;  // the CPU twin runs one thread at a time
#endif
}

struct IngestCount {
  static constexpr int kThreads = kDataThreads;
  using State = NoState;
  struct Smem {};
  const DevSlice* slices;
  int n;
  const i64* bounds;
  int nb;
  i64* counts;  // n + 1 (the last is the scan's total)

  template <class Exec>
  CPSCHED_HD void operator()(Exec& ex, int bx, int, Smem&) const {
    ex.each([&](int t, State&) {
      const i64 i = static_cast<i64>(bx) * kThreads + t;
      if (i >= n) return;
      const DevSlice s = slices[i];
      const i64 nq = block_of(bounds, nb, s.qe - 1) - block_of(bounds, nb, s.qb) + 1;
      const i64 nk = block_of(bounds, nb, s.ke - 1) - block_of(bounds, nb, s.kb) + 1;
      counts[i] = nq * nk;
    });
  }
};

// In place over counts[0..n): exclusive prefix sums; counts[n] = total.
struct IngestScan {
  static constexpr int kThreads = 1024;
  struct State {
    i64 sum;
  };
  struct Smem {
    i64 part[kThreads];
  };
  i64* counts;
  int n;

  template <class Exec>
  CPSCHED_HD void operator()(Exec& ex, int, int, Smem& sm) const {
    const i64 per = (static_cast<i64>(n) + kThreads - 1) / kThreads;
    ex.each([&](int t, State& st) {
      st.sum = 0;
      for (i64 i = t * per; i < hd_min<i64>(n, (t + 1) * per); ++i) st.sum += counts[i];
      sm.part[t] = st.sum;
    });
    ex.sync();
    ex.each([&](int t, State&) {
      if (t != 0) return;
      i64 run = 0;
      for (int i = 0; i < kThreads; ++i) {
        const i64 x = sm.part[i];
        sm.part[i] = run;
        run += x;
      }
      counts[n] = run;
    });
    ex.sync();
    ex.each([&](int t, State&) {
      i64 run = sm.part[t];
      for (i64 i = t * per; i < hd_min<i64>(n, (t + 1) * per); ++i) {
        const i64 x = counts[i];
        counts[i] = run;
        run += x;
      }
    });
  }
};

struct IngestEmit {
  static constexpr int kThreads = kDataThreads;
  using State = NoState;
  struct Smem {};
  const DevSlice* slices;
  int n;
  const i64* bounds;
  int nb;
  const i64* offsets;  // from IngestScan
  CellRecord* records;
  i64* cell_area;      // nb x nb, zeroed before

  template <class Exec>
  CPSCHED_HD void operator()(Exec& ex, int bx, int, Smem&) const {
    ex.each([&](int t, State&) {
      const i64 i = static_cast<i64>(bx) * kThreads + t;
      if (i >= n) return;
      const DevSlice s = slices[i];
      const Band2 band = band_of(s);
      const int q0 = block_of(bounds, nb, s.qb), q1 = block_of(bounds, nb, s.qe - 1);
      const int k0 = block_of(bounds, nb, s.kb), k1 = block_of(bounds, nb, s.ke - 1);
      i64 at = offsets[i];
      for (int qb = q0; qb <= q1; ++qb)
        for (int kb = k0; kb <= k1; ++kb) {
          const Band2 c = clip(band, {bounds[qb], bounds[qb + 1]}, {bounds[kb], bounds[kb + 1]});
          CellRecord r{qb, kb, band_area(c), {0, 0}, {0, 0}};
          if (r.area > 0) {
            r.rows = band_rows(c);
            r.cols = band_cols(c);
            atomic_add_i64(cell_area + static_cast<i64>(qb) * nb + kb, r.area);
          }
          records[at++] = r;
        }
    });
  }
};

// The non-empty cells of the grid from the records: area, and the union of
// the needed rows/cols of their slices, sorted by (qblock, kblock).
struct IngestedCell {
  int qblock = 0;
  int kblock = 0;
  Token area = 0;
  RangeSet rows;
  RangeSet cols;
};
std::vector<IngestedCell> cells_from_records(const std::vector<CellRecord>& records);

// Device layout of a mask and of a sharding's block boundaries.
std::vector<DevSlice> to_dev_slices(const std::vector<Slice>& slices);
std::vector<i64> block_bounds(const Sharding& sh);

}  // namespace cpsched::gpu
