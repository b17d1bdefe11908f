#include "thread_pool.hpp"

#include <algorithm>

namespace cpsched::bg {

ThreadPool::ThreadPool(int threads) {
  const int workers = std::max(threads, 1) - 1;
  workers_.reserve(static_cast<std::size_t>(workers));
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { worker_loop(); });
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
  if (depth_ > 0) return 1;
  const std::size_t by_size = n / std::max<std::size_t>(grain, 1);
  return static_cast<int>(std::clamp<std::size_t>(by_size, 1, static_cast<std::size_t>(size())));
}

void ThreadPool::run_part(int part) {
  try {
    (*body_)(part, part_begin(n_, parts_, part), part_begin(n_, parts_, part + 1));
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = std::current_exception();
  }
}

void ThreadPool::drain() {
  for (int p = next_part_.fetch_add(1); p < parts_; p = next_part_.fetch_add(1)) run_part(p);
}

void ThreadPool::parallel_for(std::size_t n, std::size_t grain, const Body& body) {
  if (n == 0) return;
  const int parts = parts_for(n, grain);
  struct Depth {
    std::atomic<int>& d;
    explicit Depth(std::atomic<int>& x) : d(x) { ++d; }
    ~Depth() { --d; }
    Depth(const Depth&) = delete;
    Depth& operator=(const Depth&) = delete;
  } inside(depth_);
  if (parts == 1) {
    body(0, 0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    body_ = &body;
    n_ = n;
    parts_ = parts;
    next_part_.store(0);
    error_ = nullptr;
    open_ = true;
    ++generation_;
  }
  wake_.notify_all();
  drain();
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lock(mu_);
    open_ = false;  // every part is claimed: late workers stay out
    idle_.wait(lock, [this] { return inside_ == 0; });
    body_ = nullptr;
    err = error_;
  }
  if (err) std::rethrow_exception(err);
}

void ThreadPool::worker_loop() {
  unsigned long long seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (!open_) continue;
    ++inside_;
    lock.unlock();
    drain();
    lock.lock();
    if (--inside_ == 0) idle_.notify_all();
  }
}

}  // namespace cpsched::bg
