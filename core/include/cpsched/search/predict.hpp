#pragma once
// The search's per-rank prediction of a whole placement in one pass: what a
// State in time mode without relays or the coupled step gives as
// max_rank_time(), without the State's counters, task lists and trees. On a
// grid of millions of tasks (P = 1024 causal: 4.2M) a State per placement
// cost more than the rest of a used-once path (docs/bounds.md#uses-and-effort);
// this keeps one bit per (segment, rank) of one head group at a time.
#include <utility>
#include <vector>

#include "cpsched/search/byte_model.hpp"
#include "cpsched/search/state.hpp"

namespace cpsched::search {

// The largest predicted rank time (seconds) of `rank` under `to`'s per-rank
// model (its relays and coupled options are not read).
double predict_max_rank_time(const ByteModel& model, const std::vector<Rank>& rank, const TimeObjective& to);
// The same in one pass with `to`'s compute and with compute on the tasks'
// exact areas at the peak rate (`to` without its kernel model): {to's, areas'}.
std::pair<double, double> predict_max_rank_times(const ByteModel& model, const std::vector<Rank>& rank,
                                                 const TimeObjective& to);

}  // namespace cpsched::search
