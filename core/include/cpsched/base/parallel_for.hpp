#pragma once
// The one parallel loop of the library, its plugins and runtimes: job(i) for
// every i in [0, n) on up to `threads` threads, the caller's among them.
//
// Items must be independent, each writing only its own outputs: the results
// then do not depend on the thread count or on which thread ran an item.
// Items are handed out one at a time in increasing order (uneven items
// balance).
//
// Errors: the exception of the lowest item that threw is rethrown once every
// thread has stopped, the same one at any thread count (once an item throws,
// the threads stop taking items; every item below it was taken before it).
//
// A thread the system refuses to start (std::system_error: a limit on
// threads or memory, on a loaded machine) is not an error: the threads
// already running, the caller's included, take its items. Neither case ends
// in std::terminate (a std::thread left joinable while the loop unwinds).
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace cpsched {

namespace detail {

// parallel_for with the thread start given: `spawn(work)` returns a started
// std::thread running `work` or throws (tests stand in a refusing one).
template <class F, class Spawn>
void parallel_for_spawned(std::size_t n, int threads, F&& job, Spawn&& spawn) {
  const std::size_t workers = std::min(n, static_cast<std::size_t>(std::max(threads, 1)));
  if (workers <= 1) {
    for (std::size_t i = 0; i < n; ++i) job(i);
    return;
  }
  std::atomic<std::size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex error_mutex;
  std::size_t error_at = n;
  std::exception_ptr error;
  auto work = [&] {
    while (!stop.load(std::memory_order_acquire)) {
      const std::size_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        job(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (i < error_at) error_at = i, error = std::current_exception();
        stop.store(true, std::memory_order_release);
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (std::size_t w = 1; w < workers; ++w) {
    try {
      pool.push_back(spawn(work));
    } catch (...) {
      break;  // refused (std::system_error, or no memory): the ones started, and this thread, do the rest
    }
  }
  work();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace detail

template <class F>
void parallel_for(std::size_t n, int threads, F&& job) {
  detail::parallel_for_spawned(n, threads, std::forward<F>(job),
                               [](auto& work) { return std::thread([&work] { work(); }); });
}

}  // namespace cpsched
