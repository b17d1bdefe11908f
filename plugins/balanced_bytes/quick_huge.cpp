// The huge path's phases: the time mode used a few times on a grid above
// member_max_tasks (P = 1024 causal: 4.2M tasks), where a State per start, its
// repair and a plan priced each cost seconds: the starts (owner, usp) are
// predicted in one pass each (predict.hpp), the best of them is balanced row
// by row to the mean load (balance_rows.hpp) and predicted again, and the
// fastest prediction wins (docs/bounds.md#uses-and-effort). No plan is priced,
// as in the full search on such grids; the stage count is the host's, 1 for auto.
#include "planner.hpp"
#include "time_mode.hpp"

#include "cpsched/base/parallel_for.hpp"
#include "cpsched/search/balance_rows.hpp"
#include "cpsched/search/placements.hpp"
#include "cpsched/search/predict.hpp"

namespace cpsched::search {

// The starts are placed and predicted apart (on two threads where given),
// then compared in order: the same choice at any thread count.
TimePlanner::Next TimePlanner::huge_starts() {
  const TaskGrid& grid = *in_.grid();
  to_ = time_objective(*in_.time_prices(), grid, opt_.spread);
  model_.emplace(grid, 1.0, 1.0);
  std::vector<Candidate>& options = pool_.candidates;
  options.resize(grid.flattened() ? 2 : 1);
  parallel_for(options.size(), opt_.threads, [&](std::size_t i) {
    options[i] = i == 0 ? Candidate{"owner", owner_placement(grid), 0, 0.0, in_.grid()}
                        : Candidate{"usp", usp_placement(grid, opt_.usp_max_degree), 0, 0.0, in_.grid()};
    options[i].predicted_s = predict_max_rank_time(*model_, options[i].rank, *to_);
  });
  return Next::go_on;
}

// The best start balanced to the mean load (rounded up), not to the cap: a
// rank left at mu x the mean makes the step
// (docs/bounds.md#the-default-solvers-phase-constants).
TimePlanner::Next TimePlanner::balance_to_mean() {
  const TaskGrid& grid = *in_.grid();
  std::vector<Candidate>& options = pool_.candidates;
  std::size_t best = 0;
  for (std::size_t i = 1; i < options.size(); ++i)
    if (options[i].predicted_s < options[best].predicted_s) best = i;
  const std::int64_t mean = (grid.total_load() + grid.cp_size() - 1) / grid.cp_size();
  if (max_load(grid, options[best].rank) > mean) {
    Candidate rows{options[best].origin + "+rows", options[best].rank, 0, 0.0, in_.grid()};
    balance_rows(grid, rows.rank, mean);
    rows.predicted_s = predict_max_rank_time(*model_, rows.rank, *to_);
    options.push_back(std::move(rows));
    if (options.back().predicted_s < options[best].predicted_s) best = options.size() - 1;
  }
  best_ = &options[best];
  return Next::go_on;
}

// The fastest prediction, at the host's stage count (1 for auto) and relays
// (none for auto); the others' predictions are noted.
TimePlanner::Next TimePlanner::choose_huge() {
  std::vector<Candidate>& options = pool_.candidates;
  const int relay = in_.shape().auto_relay() ? 0 : in_.shape().relay_node_size();
  Outcome o;
  o.path = TimePath::huge;
  for (const Candidate& c : options)
    if (&c != best_) o.remarks += "; " + c.origin + " " + num(c.predicted_s * 1e3, "%.3f") + " ms";
  o.step = best_->predicted_s;
  o.shape = PlanShape::fixed(first_stages_, relay);
  o.relay = relay;
  o.candidates = options.size();
  o.cap_mu = mu_;
  o.best = std::move(options[static_cast<std::size_t>(best_ - options.data())]);  // (4M entries at P = 1024 causal)
  best_ = nullptr;
  out_ = std::move(o);
  return Next::go_on;
}

}  // namespace cpsched::search
