#pragma once
// The binary search over the per-rank communication threshold K (Appendix A):
// lo = 0, hi = the instance's threshold, K = (lo + hi) / 2 each iteration;
// a feasible assignment (every task has an allowed rank, max load <= mu x
// mean) sets hi = K and becomes the basis of the edge weights, a failure sets
// lo = K; stop after max_iters or when hi - lo <= epsilon x hi and lo > 0.
// Result: the last success; with none, the last try (every task on its q host
// when that try left a task without an allowed rank), as published.
//
// With two or more threads each iteration also runs, alongside, the trial the
// next iteration would make if this one fails: K' = (K + hi) / 2 under the
// same weights. It is used only when the search does go there, so the result
// is the sequential one; a failed iteration then costs no extra trial.
#include <cstdint>
#include <vector>

#include <cpsched/problem/problem.hpp>

#include "edge_selection.hpp"
#include "instance.hpp"
#include "task_masks.hpp"

namespace cpsched::bg {

class ThreadPool;

struct SearchParams {
  double mu = 1.10;
  double epsilon = 0.01;
  int max_iters = 20;
  int refine_passes = 5;
};

struct SearchResult {
  std::vector<Rank> rank;  // per position (see Instance)
  bool feasible = false;
  int iterations = 0;
  double threshold = 0.0;  // K of the returned assignment: the last success, else the last try
  double max_load = 0.0;   // in compute units
};

// The buffers of one trial (stages 1 to 3 at one K).
struct TrialBuffers {
  std::vector<Word> masks;
  std::vector<double> node_cost;
  DegreeScratch degrees;
  std::vector<std::int32_t> order;
  std::vector<Rank> rank;
  std::vector<double> load;
};

// Buffers reused across iterations and solves, so the loop does not allocate.
struct Workspace {
  EdgeScorer scorer;
  TrialBuffers trial;
  TrialBuffers speculative;
};

SearchResult binary_search(const Instance& in, const SearchParams& params, ThreadPool& pool, Workspace& ws);

}  // namespace cpsched::bg
