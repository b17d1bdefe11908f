#include "solver.hpp"

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>

#include <cpsched/base/error.hpp>

namespace cpsched::bg {

namespace {

std::string num(double v, const char* fmt = "%.4g") {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

int resolve_threads(std::int64_t t) {
  if (t > 0) return static_cast<int>(std::min<std::int64_t>(t, 256));
  const unsigned hw = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(hw, 1U, 8U));
}

}  // namespace

BinaryGreedySolver::BinaryGreedySolver(const Params& p) {
  params_.mu = p.get_real("mu");
  params_.epsilon = p.get_real("epsilon");
  const std::int64_t iters = p.get_int("max_iters");
  const std::int64_t passes = p.get_int("refine_passes");
  const std::int64_t threads = p.get_int("threads");
  if (!(params_.mu >= 1.0))
    throw Error("binary_greedy: mu = " + num(params_.mu) + " must be >= 1 (balance target: max load <= mu x mean)");
  if (!(params_.epsilon >= 0.0 && params_.epsilon < 1.0))
    throw Error("binary_greedy: epsilon = " + num(params_.epsilon) + " must be in [0, 1)");
  if (iters < 1 || iters > 1000)
    throw Error("binary_greedy: max_iters = " + std::to_string(iters) + " must be in [1, 1000]");
  if (passes < 0 || passes > 1000)
    throw Error("binary_greedy: refine_passes = " + std::to_string(passes) + " must be in [0, 1000]");
  if (threads < 0)
    throw Error("binary_greedy: threads = " + std::to_string(threads) +
                " must be >= 0 (0: hardware threads, at most 8)");
  params_.max_iters = static_cast<int>(iters);
  params_.refine_passes = static_cast<int>(passes);
  threads_ = resolve_threads(threads);
}

Solution BinaryGreedySolver::solve(const SolveInput& in) {
  if (!in.grid()) throw Error("binary_greedy: no task grid given");
  const TaskGrid& grid = *in.grid();
  if (grid.cp_size() > kMaxRanks)
    throw Error("binary_greedy: cp_size = " + std::to_string(grid.cp_size()) + " exceeds the supported " +
                std::to_string(kMaxRanks) + " ranks");
  const CostModel& cost = in.cost();

  std::lock_guard<std::mutex> lock(mutex_);
  if (!pool_) pool_ = std::make_unique<ThreadPool>(threads_);
  build_instance(grid, cost, *pool_, instance_);
  SearchResult r = binary_search(instance_, params_, *pool_, workspace_);

  Solution sol;
  Assignment& a = sol.assignment;
  a.grid = in.grid();
  a.rank.resize(r.rank.size());
  for (std::size_t pos = 0; pos < r.rank.size(); ++pos)
    a.rank[static_cast<std::size_t>(instance_.task_of[pos])] = r.rank[pos];
  sol.feasible = r.feasible;
  const double mean = instance_.mean;
  const double imbalance = mean > 0.0 ? r.max_load / mean : 1.0;
  sol.figures.set("threshold", r.threshold);
  sol.figures.set("iterations", r.iterations);
  sol.figures.set("imbalance", imbalance);
  if (r.feasible) {
    sol.note = "binary_greedy: K = " + num(r.threshold) + " after " + std::to_string(r.iterations) +
             " iterations, imbalance " + num(imbalance, "%.4f") + " <= mu " + num(params_.mu);
  } else {
    const double largest =
        instance_.compute.empty() ? 0.0 : *std::max_element(instance_.compute.begin(), instance_.compute.end());
    sol.note = "binary_greedy: no assignment met mu = " + num(params_.mu) + " in " + std::to_string(r.iterations) +
             " iterations; returned the last try (as published), imbalance " + num(imbalance, "%.4f");
    if (mean > 0.0 && largest > params_.mu * mean)
      sol.note += " (a single task alone needs " + num(largest / mean, "%.4f") + " x mean load)";
    else
      sol.note += " (no single task forces it; the largest is " + num(mean > 0.0 ? largest / mean : 0.0, "%.4f") +
                " x mean load)";
  }
  return sol;
}

}  // namespace cpsched::bg
