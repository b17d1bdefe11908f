#include "thread_pool.hpp"

#include <algorithm>

namespace cpsched::bg {

ThreadPool::ThreadPool(int threads) {
  const int workers = std::max(threads, 1) - 1;
  workers_.reserve(static_cast<std::size_t>(workers));
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this, i] { worker_loop(i + 1); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  workers_.clear();  // joins
}

int ThreadPool::parts_for(std::size_t n, std::size_t grain) const {
  const std::size_t by_size = n / std::max<std::size_t>(grain, 1);
  return static_cast<int>(std::clamp<std::size_t>(by_size, 1, static_cast<std::size_t>(size())));
}

void ThreadPool::parallel_for(std::size_t n, std::size_t grain, const Body& body) {
  if (n == 0) return;
  const int parts = parts_for(n, grain);
  if (parts == 1) {
    body(0, 0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    body_ = &body;
    n_ = n;
    parts_ = parts;
    pending_ = parts - 1;
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  std::exception_ptr mine;
  try {
    body(0, 0, part_begin(n, parts, 1));
  } catch (...) {
    mine = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [this] { return pending_ == 0; });
  body_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::worker_loop(int id) {
  unsigned long long seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (id >= parts_) continue;  // this round needs fewer parts than workers
    const Body* body = body_;
    const std::size_t n = n_;
    const int parts = parts_;
    lock.unlock();
    std::exception_ptr err;
    try {
      (*body)(id, part_begin(n, parts, id), part_begin(n, parts, id + 1));
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    if (err && !error_) error_ = err;
    if (--pending_ == 0) done_.notify_one();
  }
}

}  // namespace cpsched::bg
