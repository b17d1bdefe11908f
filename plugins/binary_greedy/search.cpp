#include "search.hpp"

#include <algorithm>
#include <limits>

#include "greedy_assign.hpp"
#include "refinement.hpp"
#include "task_masks.hpp"
#include "thread_pool.hpp"

namespace cpsched::bg {

namespace {

template <int W>
SearchResult search(const Instance& in, const SearchParams& prm, ThreadPool& pool, Workspace& ws) {
  const double max_load = in.mean * std::max(prm.mu, 1.0);
  SearchResult res;
  bool have_success = false;
  // Best failed try (smallest max load; earliest on ties), returned only when
  // no try succeeds.
  std::vector<Rank> best_failed;
  double best_failed_load = std::numeric_limits<double>::infinity();
  double best_failed_k = 0.0;

  double lo = 0.0, hi = in.threshold;
  bool rescore = true;
  for (int it = 0; it < prm.max_iters; ++it) {
    const double mid = (lo + hi) / 2.0;
    res.iterations = it + 1;
    if (rescore) {
      ws.scorer.score(in, have_success ? &res.rank : nullptr, pool, W);
      rescore = false;
    }
    if (it == 0) {
      select_all_edges<W>(in, ws.masks);
    } else {
      select_edges<W>(in, ws.scorer, mid, ws.node_cost, ws.masks);
    }
    bool ok = order_by_degree<W>(in, ws.masks, pool, ws.degrees, ws.order);
    if (ok) {
      assign_greedy<W>(in, ws.masks, ws.order, ws.degrees.degree, ws.trial, ws.load);
      refine<W>(in, ws.masks, ws.order, ws.degrees.degree, max_load, prm.refine_passes, ws.trial, ws.load);
      const double mx = ws.load.empty() ? 0.0 : *std::max_element(ws.load.begin(), ws.load.end());
      ok = mx <= max_load;
      if (ok) {
        res.max_load = mx;
        res.threshold = mid;
      } else if (!have_success && mx < best_failed_load) {
        best_failed_load = mx;
        best_failed_k = mid;
        best_failed = ws.trial;
      }
    }
    if (ok) {
      have_success = true;
      std::swap(res.rank, ws.trial);
      hi = mid;
      rescore = true;
    } else {
      lo = mid;
    }
    if (hi - lo <= prm.epsilon * hi && lo > 0.0) break;
  }

  res.feasible = have_success;
  if (!have_success) {
    if (!best_failed.empty() || in.num_tasks() == 0) {
      res.rank = std::move(best_failed);
      res.max_load = best_failed_load;
      res.threshold = best_failed_k;
    } else {
      // No try placed every task: every task on its q host.
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
