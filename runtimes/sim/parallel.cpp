#include "parallel.hpp"

#include <algorithm>
#include <thread>

#include "cpsched/base/parallel_for.hpp"

namespace cpsched::sim {

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

void parallel_for(std::int64_t n, int threads, const std::function<void(std::int64_t)>& fn) {
  if (n <= 0) return;
  cpsched::parallel_for(static_cast<std::size_t>(n), threads,
                        [&](std::size_t i) { fn(static_cast<std::int64_t>(i)); });
}

int threads_for_work(double work, int max_threads) {
  constexpr double kWorkPerThread = 4.0e6;  // ~1 ms of scalar work: amortises a spawn
  const double want = work / kWorkPerThread;
  if (want <= 1.0) return 1;
  return static_cast<int>(std::min<double>(want, std::max(max_threads, 1)));
}

}  // namespace cpsched::sim
