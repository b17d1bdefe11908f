#pragma once
// Runs jobs 0..n-1 on up to `threads` threads; each job writes its own slot,
// so the results do not depend on the thread count. The first exception
// thrown by a job is rethrown once all threads have stopped.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace cpsched::search {

template <class F>
void run_jobs(std::size_t n, int threads, F&& job) {
  const auto workers = static_cast<std::size_t>(std::max(1, std::min<int>(threads, static_cast<int>(n))));
  if (workers <= 1) {
    for (std::size_t i = 0; i < n; ++i) job(i);
    return;
  }
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        job(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (std::size_t w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace cpsched::search
