#include "effort.hpp"

namespace cpsched::search {

// Coefficients measured on the 2-core benchmark machine (bench_step_time,
// fixed layout, P = 8 ... 128, docs/bounds.md#uses-and-effort): seconds per
// task, per rank and per rank squared of each phase.
namespace {
constexpr double kPriceBase = 50e-6;          // one price sheet and the timing model on it
constexpr double kPricePerTask = 0.2e-6;
constexpr double kPricePerRank = 8e-6;        // (P x stages descriptions, splits)
constexpr double kGreedyBase = 0.15e-3;       // binary_greedy as a member (area prices, one thread)
constexpr double kGreedyPerRank = 20e-6;
constexpr double kGreedyPerRank2 = 0.3e-6;
constexpr double kStaticPerTask = 4e-6;       // static's dispatched grid, solve and prediction, per input task
constexpr double kShortSearchBase = 50e-6;    // a State, the repair and 250 moves from one start
constexpr double kShortSearchPerTask = 0.1e-6;
constexpr double kShortSearchPerRank = 5e-6;
constexpr double kFullSearchBase = 1.5e-3;    // the searched starts and the bytes candidate at the time effort
constexpr double kFullSearchPerTask = 4e-6;
constexpr double kFullPlansPriced = 30;       // plans the full solve prices (starts, finals, stage choices)
constexpr double kMemberGridsPerTask = 30e-6;   // planned: searching and pricing on static's 8x finer grids
// The fixed layout's full solve as a whole (the searched starts, the bytes
// candidate, the plans priced; the coupled step and relays across nodes),
// fitted on its measured time at P = 8-64 (docs/bounds.md#uses-and-effort):
// pricing it as 30 plans, as above, missed the coupled search's growth in P.
constexpr double kFixedFullBase = 1.8e-3;
constexpr double kFixedFullPerTask = 12e-6;
constexpr double kFixedFullPerRank = 0.1e-3;
constexpr double kPolishPerMove = 0.2e-6;     // a move evaluation on one node (P = 8, ~140 tasks)
constexpr double kStagesBase = 0.2e-3;        // two stage cuts priced and every rank's transfers collected
constexpr double kStagesPerTask = 1e-6;
constexpr double kStagesPerRank2 = 0.5e-6;    // (the timing model's stage descriptions and peers)
constexpr double kStagesUnpricedBase = 0.1e-3;  // a rank's two-stage plan over its one-stage plan (every
constexpr double kStagesUnpricedPerTask = 0.5e-6;  // rank's transfers, the builder's cut), unpriced
}  // namespace

PhaseCosts predict_phase_costs(std::int64_t tasks, int ranks, bool planned) {
  const double T = static_cast<double>(tasks), P = ranks;
  PhaseCosts c;
  c.price_plan = kPriceBase + kPricePerTask * T + kPricePerRank * P;
  c.member = kGreedyBase + kGreedyPerRank * P + kGreedyPerRank2 * P * P;
  c.dispatch = kStaticPerTask * T;
  c.short_search = kShortSearchBase + kShortSearchPerTask * T + kShortSearchPerRank * P;
  c.stages_unpriced = kStagesUnpricedBase + kStagesUnpricedPerTask * T;
  c.stages = kStagesBase + kStagesPerTask * T + kStagesPerRank2 * P * P;
  c.polish = c.short_search + kPolishPerMove * static_cast<double>(kPolishMoves) + c.price_plan;
  if (planned)  // static's two members and their grids
    c.full = c.member + kFullSearchBase + kFullSearchPerTask * T + kFullPlansPriced * c.price_plan + 2 * c.dispatch +
             kMemberGridsPerTask * T;
  else
    c.full = c.member + kFixedFullBase + kFixedFullPerTask * T + kFixedFullPerRank * P;
  return c;
}

}  // namespace cpsched::search
