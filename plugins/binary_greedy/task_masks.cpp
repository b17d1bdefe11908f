#include "task_masks.hpp"

#include <algorithm>
#include <numeric>

#include "instance.hpp"
#include "thread_pool.hpp"

namespace cpsched::bg {

namespace {

// Each part of the positions is cut into kLanes contiguous segments that are
// walked side by side: a histogram counter or scatter cursor per segment and
// degree, so consecutive tasks of equal degree do not wait on one counter.
constexpr int kLanes = 4;
constexpr std::size_t kGrain = 8192;

std::size_t lane_begin(std::size_t p0, std::size_t p1, int lane) {
  return p0 + (p1 - p0) * static_cast<std::size_t>(lane) / kLanes;
}

// f(lane, pos) over the kLanes segments of [p0, p1), interleaved; within a
// segment in increasing position.
template <class F>
void interleaved(std::size_t p0, std::size_t p1, F&& f) {
  std::size_t at[kLanes], end[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    at[l] = lane_begin(p0, p1, l);
    end[l] = lane_begin(p0, p1, l + 1);
  }
  const std::size_t common = end[0] - at[0];  // the shortest segment is the first
  for (std::size_t i = 0; i < common; ++i)
    for (int l = 0; l < kLanes; ++l) f(l, at[l] + i);
  for (int l = 0; l < kLanes; ++l)
    for (std::size_t pos = at[l] + common; pos < end[l]; ++pos) f(l, pos);
}

}  // namespace

template <int W>
bool order_by_degree(const Instance& in, const std::vector<Word>& masks, ThreadPool& pool, DegreeScratch& s,
                     std::vector<std::int32_t>& order) {
  const std::size_t T = in.num_tasks();
  const std::size_t kv0 = static_cast<std::size_t>(in.num_chunks) * W;
  const std::size_t nd = static_cast<std::size_t>(in.P) + 1;  // degrees 0 .. P
  const int parts = pool.parts_for(T, kGrain);
  const std::size_t segments = static_cast<std::size_t>(parts) * kLanes;
  s.degree.resize(T);
  s.hist.assign(segments * nd, 0);

  // Degrees, and a histogram per segment (fixed ranges of positions).
  pool.parallel_for(T, kGrain, [&](int part, std::size_t p0, std::size_t p1) {
    for (std::size_t pos = p0; pos < p1; ++pos) {
      const Word* q = masks.data() + static_cast<std::size_t>(in.qchunk[pos]) * W;
      const Word* k = masks.data() + kv0 + static_cast<std::size_t>(in.kchunk[pos]) * W;
      s.degree[pos] = static_cast<std::uint16_t>(RankMask<W>::count_and(q, k));
    }
    std::int32_t* h = s.hist.data() + static_cast<std::size_t>(part) * kLanes * nd;
    interleaved(p0, p1, [&](int lane, std::size_t pos) { ++h[static_cast<std::size_t>(lane) * nd + s.degree[pos]]; });
  });
  std::size_t zero = 0;
  for (std::size_t seg = 0; seg < segments; ++seg) zero += static_cast<std::size_t>(s.hist[seg * nd]);
  if (zero != 0) return false;  // a task with no allowed rank

  order.resize(T);
  // One degree for all (always so in iteration 0): the positions in order.
  for (std::size_t d = 1; d < nd; ++d) {
    std::size_t n = 0;
    for (std::size_t seg = 0; seg < segments; ++seg) n += static_cast<std::size_t>(s.hist[seg * nd + d]);
    if (n == T) {
      std::iota(order.begin(), order.end(), 0);
      return true;
    }
    if (n != 0) break;
  }

  // Stable counting sort of the positions (the static order) by degree: the
  // tasks of degree d in segment i follow those of segments < i, so every
  // segment scatters on its own cursor.
  std::size_t next = 0;
  for (std::size_t d = 0; d < nd; ++d)
    for (std::size_t seg = 0; seg < segments; ++seg) {
      std::int32_t& h = s.hist[seg * nd + d];
      const std::int32_t n = h;
      h = static_cast<std::int32_t>(next);
      next += static_cast<std::size_t>(n);
    }
  pool.parallel_for(T, kGrain, [&](int part, std::size_t p0, std::size_t p1) {
    std::int32_t* at = s.hist.data() + static_cast<std::size_t>(part) * kLanes * nd;
    interleaved(p0, p1, [&](int lane, std::size_t pos) {
      order[static_cast<std::size_t>(at[static_cast<std::size_t>(lane) * nd + s.degree[pos]]++)] =
          static_cast<std::int32_t>(pos);
    });
  });
  return true;
}

#define CPSCHED_BG_INSTANTIATE(W)                                                                          \
  template bool order_by_degree<W>(const Instance&, const std::vector<Word>&, ThreadPool&, DegreeScratch&, \
                                   std::vector<std::int32_t>&);
CPSCHED_BG_INSTANTIATE(1)
CPSCHED_BG_INSTANTIATE(2)
CPSCHED_BG_INSTANTIATE(4)
CPSCHED_BG_INSTANTIATE(8)
CPSCHED_BG_INSTANTIATE(16)
#undef CPSCHED_BG_INSTANTIATE

}  // namespace cpsched::bg
