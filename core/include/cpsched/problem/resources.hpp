#pragma once
// Up-front resource estimates: what a problem's grid, plan and simulation
// will need, computed before any of them is built, and a check against the
// memory budget (base/memory_budget.hpp) that stops with an error saying
// what to change.
#include <cstdint>
#include <string>

#include "cpsched/base/limits.hpp"
#include "cpsched/base/memory_budget.hpp"
#include "cpsched/problem/problem.hpp"

namespace cpsched {

// The bytes of one attention arg (plan/plan.hpp's AttnArg) the plan estimate
// counts; the plan checks its struct against it at compile time
// (plan/arg_area.cpp), so the estimate needs no include of the plan above it.
inline constexpr std::int64_t kPlanArgBytes = 64;

// Every mask kind is estimated: range masks from their slices, block
// selections (block_topk, bsr) from their per-head range masks, token top-k
// masks from one counting pass over the indices (count_index_plan: the cells,
// their rows and widest rows, so the plan's index pools are bounded before
// they exist). Parts, in bytes:
struct ResourceEstimate {
  std::int64_t blocks = 0;           // P x blocks_per_rank
  std::int64_t cells = 0;            // non-empty cells (upper bound; exact when no two slices share a cell)
  std::int64_t touches = 0;          // (slice, cell) pairs: the cells' pieces and needed-row ranges
  std::int64_t tasks = 0;            // cells x head groups
  std::int64_t selected_pairs = 0;   // index masks: the selected (query, key) pairs of all selection heads
  std::int64_t index_pool = 0;       // index masks: index-pool entries of one pass of the plan (int32 each)
  std::int64_t mask_bytes = 0;       // the mask the problem holds: slices, per-head masks, index arrays
  std::int64_t selection_bytes = 0;  // token top-k: the sorted rows (SelectionRows) the grid and plan read
  std::int64_t grid_bytes = 0;       // the TaskGrid (and count_index_cells' working memory)
  std::int64_t plan_bytes = 0;       // assignment, solver state per task, transfers and the Plan (both passes, index pools included)
  std::int64_t validator_bytes = 0;  // validate_plan (plan --validate, SessionOptions::validate)
  std::int64_t sim_numeric_bytes = 0;  // the sim executor's fp32 tensors in mode numeric (with its reference)
  // Mask + selection + grid + plan, the validator and the numeric simulation when asked.
  std::int64_t total_bytes(bool sim_numeric, bool validate = false) const;
};

// O(slices x log blocks + q blocks spanned by diagonal slices) for range
// masks, one pass over the indices for token top-k masks; allocates nothing
// in proportion to the grid. `p` must be valid (Problem::validate).
ResourceEstimate estimate_resources(const Problem& p);
// The same mask and heads over another sharding (the static solver's dispatch).
ResourceEstimate estimate_resources(const Problem& p, const Sharding& sharding);

// Throws LimitError when the estimate needs more than the budget; the
// message gives the figures, the budget's source, the size to raise it to
// (memory_budget) and what to lower. Its key: "grid.blocks_per_rank" or
// "cp_size" for range masks, "mask" for index masks (whose size the
// selection drives: topk, nsa_top, the indices' width).
void check_resources(const Problem& p, const ResourceEstimate& e, const MemoryBudget& budget,
                     bool sim_numeric = false, bool validate = false);
// estimate_resources + check_resources with default_memory_budget().
void check_resources(const Problem& p, bool sim_numeric = false, bool validate = false);

}  // namespace cpsched
