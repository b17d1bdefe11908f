#pragma once
// An unpriced balance of a placement for grids too large to repair priced:
// the tasks that leave a rank above the target go, row by row (a q block's
// tasks of one head group), to one rank while it has room, so that each row's
// Q rows travel to few ranks. The repair's unpriced moves send each task to
// its kv host or the least loaded rank, scattering a heavy row's Q over
// hundreds of ranks, so that its plan stayed behind usp as it is
// (docs/bounds.md#measurements-behind-code-constants).
#include <cstdint>
#include <vector>

#include <cpsched/problem/task_grid.hpp>

namespace cpsched::search {

// Moves tasks of `rank` off ranks whose load is above `target`, heaviest rank
// first (ties: lower rank). A rank's tasks leave by head group, then in task
// order; tasks whose q and kv hosts are the rank stay. A task goes where its
// row's last moved task went if that rank has room, else to the least loaded
// rank if it has room, else it stays. O(T + moves x log P).
void balance_rows(const TaskGrid& grid, std::vector<Rank>& rank, std::int64_t target);

}  // namespace cpsched::search
