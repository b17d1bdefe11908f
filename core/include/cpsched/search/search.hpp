#pragma once
// Local search on a State: repair (meet the balance cap), descent (improving
// relocations and swaps under the cap) and an iterated local search (kick,
// repair, descend; keep the best). Effort is counted in move evaluations, never
// in time, so results do not depend on the machine or the thread count.
#include <cstdint>
#include <random>
#include <vector>

#include "cpsched/search/state.hpp"

namespace cpsched::search {

struct Budget {
  std::int64_t left = 0;
  bool spent() const { return left <= 0; }
};

// Moves tasks off ranks above the cap, cheapest bytes per unit of load first
// (lazy greedy: a task's price is refreshed when it comes up; when a move
// brings block data to a rank for the first time, the siblings that share it
// are re-priced for that rank). Priced evaluations are bounded (time mode:
// 2M; bytes mode: max(2M, 4 per task)), whatever the budget; what is left
// above the cap then moves, largest tasks first, to the least loaded rank
// with room. Returns true when every rank ends at or below the cap.
bool repair(State& st, Budget& budget);
// The same with at most `priced` priced evaluations (and never more than
// repair's) and nothing moved unpriced: false when ranks are left above the
// cap (for the caller to go on another way).
bool repair_priced(State& st, Budget& budget, std::int64_t priced);

// Improving relocations and swaps that put no rank above the cap, until none
// is left or the budget ends. Tasks are examined from a work list: all of them
// first; after a move, those whose prices or room it changed.
void descend(State& st, Budget& budget);
// The same, starting from the tasks that the given moves (task, rank it left)
// affected.
void descend_after(State& st, Budget& budget, const std::vector<std::pair<TaskId, Rank>>& moves);

// Kicks a few related tasks to other ranks, repairs and descends; keeps the
// best feasible placement seen (ties: the later one, to drift on plateaus).
void iterate(State& st, Budget& budget, std::uint64_t seed);

}  // namespace cpsched::search
