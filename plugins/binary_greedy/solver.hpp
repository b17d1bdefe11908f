#pragma once
// The `binary_greedy` solver: the seed's algorithm as published (docs/design.md#solvers,
// Appendix A). Holds its thread pool and buffers between solves.
#include <memory>
#include <mutex>

#include <cpsched/plugin/params.hpp>
#include <cpsched/plugin/solver.hpp>

#include "instance.hpp"
#include "search.hpp"
#include "thread_pool.hpp"

namespace cpsched::bg {

class BinaryGreedySolver final : public Solver {
 public:
  explicit BinaryGreedySolver(const Params& params);
  Solution solve(const SolveInput& in) override;

  static constexpr int kMaxRanks = 1024;  // widest rank mask: 16 words

 private:
  SearchParams params_;
  int threads_ = 1;
  std::mutex mutex_;  // one solve at a time: the buffers are shared
  std::unique_ptr<ThreadPool> pool_;
  Instance instance_;
  Workspace workspace_;
};

}  // namespace cpsched::bg
