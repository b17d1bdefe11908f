#include "parallel.hpp"

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace cpsched::sim {

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

void parallel_for(std::int64_t n, int threads, const std::function<void(std::int64_t)>& fn) {
  if (n <= 0) return;
  const std::int64_t t = std::min<std::int64_t>(std::max(threads, 1), n);
  if (t == 1) {
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::exception_ptr first;
  std::mutex mu;
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(t));
  for (std::int64_t w = 0; w < t; ++w) {
    const std::int64_t lo = n * w / t, hi = n * (w + 1) / t;
    pool.emplace_back([&, lo, hi] {
      try {
        for (std::int64_t i = lo; i < hi; ++i) fn(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (std::thread& th : pool) th.join();
  if (first) std::rethrow_exception(first);
}

int threads_for_work(double work, int max_threads) {
  constexpr double kWorkPerThread = 4.0e6;  // ~1 ms of scalar work: amortises a spawn
  const double want = work / kWorkPerThread;
  if (want <= 1.0) return 1;
  return static_cast<int>(std::min<double>(want, std::max(max_threads, 1)));
}

}  // namespace cpsched::sim
