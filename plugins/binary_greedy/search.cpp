#include "search.hpp"

#include <algorithm>
#include <atomic>
#include <limits>

#include "greedy_assign.hpp"
#include "refinement.hpp"
#include "thread_pool.hpp"

namespace cpsched::bg {

namespace {

struct TrialOutcome {
  bool placed = false;  // every task had an allowed rank
  double max_load = 0.0;
};

// Stages 1 (selection under K, or every edge), 2 and 3 into `b`.
template <int W>
TrialOutcome run_trial(const Instance& in, const SearchParams& prm, const EdgeScorer& scorer, bool all_edges,
                       double K, double max_load, ThreadPool& pool, TrialBuffers& b) {
  if (all_edges) {
    select_all_edges<W>(in, b.masks);
  } else {
    select_edges<W>(in, scorer, K, b.node_cost, b.masks);
  }
  TrialOutcome out;
  out.placed = order_by_degree<W>(in, b.masks, pool, b.degrees, b.order);
  if (!out.placed) return out;
  assign_greedy<W>(in, b.masks, b.order, b.degrees.degree, b.rank, b.load);
  refine<W>(in, b.masks, b.order, b.degrees.degree, max_load, prm.refine_passes, b.rank, b.load);
  out.max_load = b.load.empty() ? 0.0 : *std::max_element(b.load.begin(), b.load.end());
  return out;
}

template <int W>
SearchResult search(const Instance& in, const SearchParams& prm, ThreadPool& pool, Workspace& ws) {
  const double max_load = in.mean * std::max(prm.mu, 1.0);
  // A side trial pays off once a trial outweighs waking a worker (tens of us).
  constexpr std::size_t kSpeculateTasks = 4096;
  const bool speculate = pool.size() >= 2 && in.num_tasks() >= kSpeculateTasks;
  SearchResult res;
  bool have_success = false;
  // The last try, returned when no try succeeds (as published: not the best
  // failed try, which would flatter the algorithm). Its ranks are ws.trial.rank
  // when it placed every task.
  TrialOutcome last;
  double last_k = 0.0;

  bool spec_ready = false;  // ws.speculative holds the trial at spec_k under the current weights
  double spec_k = 0.0;
  TrialOutcome spec_out;

  double lo = 0.0, hi = in.threshold;
  bool rescore = true;
  for (int it = 0; it < prm.max_iters; ++it) {
    const double mid = (lo + hi) / 2.0;
    res.iterations = it + 1;
    if (rescore) {
      ws.scorer.score(in, have_success ? &res.rank : nullptr, pool, W);
      rescore = false;
      spec_ready = false;
    }
    TrialOutcome out;
    if (spec_ready && spec_k == mid) {
      std::swap(ws.trial, ws.speculative);
      out = spec_out;
      spec_ready = false;
    } else if (speculate && it + 1 < prm.max_iters) {
      // This trial and, alongside, the next iteration's should this one fail.
      // The side trial is only worth starting while this one runs: a thread
      // that reaches it afterwards skips it.
      const double next_k = (mid + hi) / 2.0;
      std::atomic<bool> main_done{false};
      bool side_ran = false;
      pool.parallel_for(2, 1, [&](int part, std::size_t, std::size_t) {
        if (part == 0) {
          out = run_trial<W>(in, prm, ws.scorer, it == 0, mid, max_load, pool, ws.trial);
          main_done.store(true);
        } else if (!main_done.load()) {
          spec_out = run_trial<W>(in, prm, ws.scorer, false, next_k, max_load, pool, ws.speculative);
          side_ran = true;
        }
      });
      spec_ready = side_ran;
      spec_k = next_k;
    } else {
      out = run_trial<W>(in, prm, ws.scorer, it == 0, mid, max_load, pool, ws.trial);
    }

    const bool ok = out.placed && out.max_load <= max_load;
    last = out;
    last_k = mid;
    if (ok) {
      res.max_load = out.max_load;
      res.threshold = mid;
      // The weights depend on the basis only: an unchanged basis keeps the
      // scored and sorted runs valid (common on regular masks).
      rescore = !have_success || ws.trial.rank != res.rank;
      have_success = true;
      std::swap(res.rank, ws.trial.rank);
      hi = mid;
      spec_ready = false;  // it was made for the failure branch
    } else {
      lo = mid;
    }
    if (hi - lo <= prm.epsilon * hi && lo > 0.0) break;
  }

  res.feasible = have_success;
  if (!have_success) {
    res.threshold = last_k;
    if (last.placed) {
      res.rank = ws.trial.rank;
      res.max_load = last.max_load;
    } else {
      // The last try left a task without an allowed rank: the published code
      // then marks every task unplaced, and unplaced tasks go to their q host.
      res.rank = in.qhost;
      std::vector<double> load(static_cast<std::size_t>(in.P), 0.0);
      for (std::size_t t = 0; t < in.num_tasks(); ++t) load[static_cast<std::size_t>(in.qhost[t])] += in.compute[t];
      res.max_load = load.empty() ? 0.0 : *std::max_element(load.begin(), load.end());
    }
  }
  return res;
}

}  // namespace

SearchResult binary_search(const Instance& in, const SearchParams& params, ThreadPool& pool, Workspace& ws) {
  switch (mask_words(in.P)) {
    case 1: return search<1>(in, params, pool, ws);
    case 2: return search<2>(in, params, pool, ws);
    case 4: return search<4>(in, params, pool, ws);
    case 8: return search<8>(in, params, pool, ws);
    default: return search<16>(in, params, pool, ws);
  }
}

}  // namespace cpsched::bg
