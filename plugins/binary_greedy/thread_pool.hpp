#pragma once
// A small fixed pool of worker threads for data-parallel loops.
//
// Determinism contract: parallel_for cuts [0, n) into contiguous parts and
// runs the body once per part; callers only parallelise work whose items are
// independent, keep per-part scratch by part index and combine per-part
// outputs in part order, so the result does not depend on how many threads
// ran it, nor on which thread ran which part.
//
// The calling thread takes parts too, and waits only for parts a worker has
// already started: on a busy machine where a worker is not scheduled, the
// caller simply runs the rest itself.
#include <atomic>
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
  // hold at least `grain` items (>= 1). Inside a part of another of this
  // pool's parallel_for (nested) it is 1: the nested loop runs inline. One
  // caller at a time: the pool runs one job.
  int parts_for(std::size_t n, std::size_t grain) const;

  // Runs body(part, begin, end) over parts_for(n, grain) contiguous parts of
  // [0, n) and returns when all of them have run. The first exception thrown
  // by a part is rethrown here.
  using Body = std::function<void(int part, std::size_t begin, std::size_t end)>;
  void parallel_for(std::size_t n, std::size_t grain, const Body& body);

  // The bounds of part p of `parts` over [0, n).
  static std::size_t part_begin(std::size_t n, int parts, int p) {
    return n * static_cast<std::size_t>(p) / static_cast<std::size_t>(parts);
  }

 private:
  void worker_loop();
  // Claims and runs parts of the current job until none is left.
  void drain();
  void run_part(int part);

  std::vector<std::jthread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  unsigned long long generation_ = 0;
  bool stop_ = false;
  // The current job.
  const Body* body_ = nullptr;
  std::size_t n_ = 0;
  int parts_ = 0;
  bool open_ = false;               // workers may still join the job
  int inside_ = 0;                  // workers inside the job
  std::atomic<int> next_part_{0};
  std::exception_ptr error_;
  // parallel_for calls in progress on this pool: above 0, a call comes from
  // inside a part (one caller at a time uses a pool), so it runs inline. A
  // member, not thread_local: a plugin's TLS outlives its unloading in the
  // threads that touched it, which LeakSanitizer then scans and crashes on.
  std::atomic<int> depth_{0};
};

}  // namespace cpsched::bg
