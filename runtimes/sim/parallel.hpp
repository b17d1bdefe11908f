#pragma once
// A deterministic parallel loop: items are cut into contiguous chunks, one per
// thread, so every output element is written by exactly one thread in a fixed
// order and results do not depend on the thread count.
#include <cstdint>
#include <functional>

namespace cpsched::sim {

// Threads to use: `requested` (0 = all hardware threads), at least 1.
int resolve_threads(int requested);

// Runs fn(i) for every i in [0, n) on up to `threads` threads. The first
// exception thrown by any item is rethrown after all threads joined.
void parallel_for(std::int64_t n, int threads, const std::function<void(std::int64_t)>& fn);

// Threads worth spawning for `work` multiply-adds: spawning costs tens of
// microseconds, so small calls run inline.
int threads_for_work(double work, int max_threads);

}  // namespace cpsched::sim
