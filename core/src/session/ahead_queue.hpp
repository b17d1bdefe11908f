#pragma once
// Planning ahead (Session::solve_async): one background thread solves queued
// range masks in order, and each result lands in the plan cache before its
// future is ready, so a later solve() of the same mask is a cache hit.
// Identical masks in flight share one solve. The queue is bounded: a caller
// that would overfill it waits for a slot (back-pressure on a data loader
// that runs too far ahead).
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "cpsched/plan/cache.hpp"
#include "cpsched/problem/problem.hpp"

namespace cpsched::detail {

using ResultFuture = std::shared_future<std::shared_ptr<const SolveResult>>;

class AheadQueue {
 public:
  // `run` solves one problem (on the background thread); `cache` receives
  // every result under its key. `capacity` >= 1 masks may wait (the
  // Session checks SessionOptions::ahead_queue).
  using Run = std::function<std::shared_ptr<const SolveResult>(std::shared_ptr<const Problem>)>;
  AheadQueue(Run run, PlanCache& cache, std::size_t capacity);
  // Finishes the mask being solved; the ones still waiting fail with an
  // error saying the session closed.
  ~AheadQueue();
  AheadQueue(const AheadQueue&) = delete;
  AheadQueue& operator=(const AheadQueue&) = delete;

  // The result of `key`: ready at once from the cache, shared with an
  // identical mask in flight, or queued. `make` builds the problem (called
  // only when it must be solved, outside the queue's lock).
  ResultFuture submit(const PlanKey& key, const std::function<std::shared_ptr<const Problem>()>& make);
  // The future of `key` when it is in flight (queued or being solved).
  std::optional<ResultFuture> in_flight(const PlanKey& key) const;
  std::size_t capacity() const { return capacity_; }

 private:
  struct Job {
    PlanKey key;
    std::shared_ptr<const Problem> problem;
    std::promise<std::shared_ptr<const SolveResult>> promise;
    ResultFuture future;
  };
  void work();
  const ResultFuture* find_locked(const PlanKey& key) const;

  Run run_;
  PlanCache& cache_;
  std::size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable has_job_, has_room_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::shared_ptr<Job> current_;  // being solved
  bool stop_ = false;
  std::thread worker_;  // started by the first submit that queues
};

}  // namespace cpsched::detail
