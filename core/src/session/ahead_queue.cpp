#include "ahead_queue.hpp"

#include <optional>

#include "cpsched/base/error.hpp"

namespace cpsched::detail {

AheadQueue::AheadQueue(Run run, PlanCache& cache, std::size_t capacity)
    : run_(std::move(run)), cache_(cache), capacity_(capacity) {}

AheadQueue::~AheadQueue() {
  std::deque<std::shared_ptr<Job>> left;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    left.swap(queue_);
  }
  has_job_.notify_all();
  has_room_.notify_all();
  for (auto& j : left)
    j->promise.set_exception(
        std::make_exception_ptr(Error("session: closed before this mask planned ahead (solve_async) was solved")));
  if (worker_.joinable()) worker_.join();
}

const ResultFuture* AheadQueue::find_locked(const PlanKey& key) const {
  if (current_ && current_->key == key) return &current_->future;
  for (const auto& j : queue_)
    if (j->key == key) return &j->future;
  return nullptr;
}

std::optional<ResultFuture> AheadQueue::in_flight(const PlanKey& key) const {
  std::lock_guard lock(mu_);
  if (const ResultFuture* f = find_locked(key)) return *f;
  return std::nullopt;
}

ResultFuture AheadQueue::submit(const PlanKey& key, const std::function<std::shared_ptr<const Problem>()>& make) {
  auto ready = [](std::shared_ptr<const SolveResult> r) {
    std::promise<std::shared_ptr<const SolveResult>> p;
    p.set_value(std::move(r));
    return p.get_future().share();
  };
  {
    std::lock_guard lock(mu_);
    if (const ResultFuture* f = find_locked(key)) return *f;
  }
  if (auto hit = cache_.find(key)) return ready(std::move(hit));
  auto job = std::make_shared<Job>();
  job->key = key;
  job->problem = make();  // mask errors reach the caller here, not through the future
  job->future = job->promise.get_future().share();
  std::unique_lock lock(mu_);
  has_room_.wait(lock, [&] { return stop_ || queue_.size() < capacity_; });
  if (stop_) throw Error("session: closed");
  // Another caller may have queued the same mask while this one built it.
  if (const ResultFuture* f = find_locked(key)) return *f;
  queue_.push_back(job);
  if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
  lock.unlock();
  has_job_.notify_one();
  return job->future;
}

void AheadQueue::work() {
  std::unique_lock lock(mu_);
  for (;;) {
    has_job_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopped
    current_ = std::move(queue_.front());
    queue_.pop_front();
    has_room_.notify_one();
    lock.unlock();
    std::shared_ptr<const SolveResult> result;
    std::exception_ptr failed;
    try {
      result = run_(current_->problem);
    } catch (...) {
      failed = std::current_exception();
    }
    // Into the cache before the future is ready and the mask leaves the
    // in-flight list, so a solve() of it always finds one or the other.
    if (result) cache_.insert(current_->key, result);
    lock.lock();
    std::shared_ptr<Job> done = std::move(current_);
    current_.reset();
    lock.unlock();
    if (failed) done->promise.set_exception(failed);
    else done->promise.set_value(std::move(result));
    lock.lock();
  }
}

}  // namespace cpsched::detail
