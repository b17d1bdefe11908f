// The time mode used a few times on a grid above member_max_tasks (P = 1024
// causal: 4.2M tasks), where a State per start, its repair and a plan priced
// each cost seconds: the starts (owner, usp) are predicted in one pass each
// (predict.hpp), the best of them is balanced row by row to the mean load
// (balance_rows.hpp) and predicted again, and the fastest prediction wins
// (docs/bounds.md#uses-and-effort). No plan is priced, as in the full search
// on such grids; the stage count is the host's, 1 for auto.
#include "balanced_bytes.hpp"
#include "time_mode.hpp"

#include <cstdio>

#include "cpsched/base/parallel_for.hpp"
#include "cpsched/search/balance_rows.hpp"
#include "cpsched/search/byte_model.hpp"
#include "cpsched/search/placements.hpp"
#include "cpsched/search/predict.hpp"

namespace cpsched::search {

Solution BalancedBytes::solve_time_huge(const SolveInput& in) const {
  const TaskGrid& grid = *in.grid();
  const TimeObjective to = time_objective(*in.time_prices(), grid, opt_.spread);
  const ByteModel model(grid, 1.0, 1.0);
  struct Option {
    std::string origin;
    std::vector<Rank> rank;
    double predicted_s = 0;
  };
  // The starts are placed and predicted apart (on two threads where given),
  // then compared in order: the same choice at any thread count.
  std::vector<Option> options(grid.flattened() ? 2 : 1);
  parallel_for(options.size(), opt_.threads, [&](std::size_t i) {
    options[i] = i == 0 ? Option{"owner", owner_placement(grid)} : Option{"usp", usp_placement(grid, opt_.usp_max_degree)};
    options[i].predicted_s = predict_max_rank_time(model, options[i].rank, to);
  });
  std::size_t best = 0;
  for (std::size_t i = 1; i < options.size(); ++i)
    if (options[i].predicted_s < options[best].predicted_s) best = i;
  // The mean load (rounded up), not the cap: a rank left at mu x the mean
  // makes the step (P = 1024 causal: usp balanced to the cap 1.22 x the
  // compute bound, to the mean 1.16).
  const std::int64_t mean = (grid.total_load() + grid.cp_size() - 1) / grid.cp_size();
  if (max_load(grid, options[best].rank) > mean) {
    Option rows{options[best].origin + "+rows", options[best].rank};
    balance_rows(grid, rows.rank, mean);
    rows.predicted_s = predict_max_rank_time(model, rows.rank, to);
    options.push_back(std::move(rows));
    if (options.back().predicted_s < options[best].predicted_s) best = options.size() - 1;
  }

  const int stages = in.shape().auto_stages() ? 1 : in.shape().stages;
  const int relay = in.shape().auto_relay() ? 0 : in.shape().relay_node_size();
  Option& b = options[best];
  Solution sol;
  sol.feasible = balance_cap(grid, opt_.mu) >= max_load(grid, b.rank);
  sol.shape = PlanShape::fixed(stages, relay);
  sol.figures.set("predicted_step_s", b.predicted_s);
  sol.figures.set("candidates", static_cast<double>(options.size()));
  sol.figures.set("plans_priced", 0);
  sol.figures.set("stages", stages);
  sol.figures.set("relay_node_size", relay);
  sol.figures.set("blocks_per_rank", grid.problem().grid.blocks_per_rank);
  sol.figures.set("full_search", 0);
  char step[64];
  std::snprintf(step, sizeof step, "%.3f", b.predicted_s * 1e3);
  sol.note = "balanced_bytes (time): " + b.origin + " on " + std::to_string(grid.problem().grid.blocks_per_rank) +
             " block(s) per rank, " + std::to_string(stages) + " stage(s), predicted step " + step +
             " ms by the search's model; planned for " + in.uses().str() +
             " use(s) on a grid above member_max_tasks: the starts and the best balanced by rows, no search";
  for (const Option& o : options) {
    std::snprintf(step, sizeof step, "%.3f", o.predicted_s * 1e3);
    if (&o != &b) sol.note += "; " + o.origin + " " + step + " ms";
  }
  sol.assignment.grid = in.grid();
  sol.assignment.rank = std::move(b.rank);  // (4M entries at P = 1024 causal)
  if (!sol.feasible) {
    std::snprintf(step, sizeof step, "%g", opt_.mu);
    sol.note += std::string("; the chosen plan is above mu = ") + step;
  }
  return sol;
}

}  // namespace cpsched::search
