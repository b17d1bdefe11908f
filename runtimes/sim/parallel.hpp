#pragma once
// The sim's parallel loop (the library's, base/parallel_for.hpp): every item
// writes only its own output elements, so results do not depend on the
// thread count.
#include <cstdint>
#include <functional>

namespace cpsched::sim {

// Threads to use: `requested` (0 = all hardware threads), at least 1.
int resolve_threads(int requested);

// Runs fn(i) for every i in [0, n) on up to `threads` threads. The
// exception of the lowest item that threw is rethrown after all joined.
void parallel_for(std::int64_t n, int threads, const std::function<void(std::int64_t)>& fn);

// Threads worth spawning for `work` multiply-adds: spawning costs tens of
// microseconds, so small calls run inline.
int threads_for_work(double work, int max_threads);

}  // namespace cpsched::sim
