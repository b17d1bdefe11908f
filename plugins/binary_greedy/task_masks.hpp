#pragma once
// Stage 2, first half: each task's allowed ranks are its q chunk's allowed
// ranks intersected with its kv chunk's; the tasks are then ordered by
// (fewest allowed ranks, largest compute, published grid order).
#include <cstdint>
#include <vector>

#include "rank_mask.hpp"

namespace cpsched::bg {

struct Instance;
class ThreadPool;

struct DegreeScratch {
  std::vector<std::uint16_t> degree;  // per position
  std::vector<std::int32_t> hist;     // per (part, degree)
};

// Counts each task's allowed ranks and, when every task has at least one,
// fills `order` with the positions stably sorted by degree (positions are the
// static order). Returns false (order untouched) when some task has none.
template <int W>
bool order_by_degree(const Instance& in, const std::vector<Word>& masks, ThreadPool& pool, DegreeScratch& scratch,
                     std::vector<std::int32_t>& order);

}  // namespace cpsched::bg
