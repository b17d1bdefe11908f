#pragma once
// A small fixed pool of worker threads for data-parallel loops.
//
// Determinism contract: parallel_for cuts [0, n) into contiguous parts and
// runs the body once per part; callers only parallelise work whose items are
// independent and combine per-part outputs in part order, so the result does
// not depend on how many threads ran it.
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace cpsched::bg {

class ThreadPool {
 public:
  // `threads` >= 1 counts the calling thread: threads - 1 workers are started.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Number of parts parallel_for will use for n items when each part should
  // hold at least `grain` items (>= 1).
  int parts_for(std::size_t n, std::size_t grain) const;

  // Runs body(part, begin, end) over parts_for(n, grain) contiguous parts of
  // [0, n) and waits for all of them. The first exception thrown by a part is
  // rethrown here after every part finished.
  using Body = std::function<void(int part, std::size_t begin, std::size_t end)>;
  void parallel_for(std::size_t n, std::size_t grain, const Body& body);

  // The bounds of part p of `parts` over [0, n).
  static std::size_t part_begin(std::size_t n, int parts, int p) {
    return n * static_cast<std::size_t>(p) / static_cast<std::size_t>(parts);
  }

 private:
  void worker_loop(int id);

  std::vector<std::jthread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const Body* body_ = nullptr;
  std::size_t n_ = 0;
  int parts_ = 0;
  unsigned long long generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace cpsched::bg
