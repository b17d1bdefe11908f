#pragma once
// Up-front resource estimates: what a problem's grid, plan and simulation
// will need, computed before any of them is built, and a check against a
// memory budget that stops with an error saying what to change.
//
// The budget: CPSCHED_MEMORY_BUDGET (bytes, or with a K/M/G/T suffix:
// "16G"), else MemAvailable of /proc/meminfo, else unlimited. A front end with
// its own setting passes it to check_resources.
#include <cstdint>
#include <string>
#include <string_view>

#include "cpsched/limits.hpp"
#include "cpsched/problem.hpp"

namespace cpsched {

struct ResourceEstimate {
  std::int64_t blocks = 0;           // P x blocks_per_rank
  std::int64_t cells = 0;            // non-empty cells (upper bound; exact when no two slices share a cell)
  std::int64_t touches = 0;          // (slice, cell) pairs: the cells' pieces and needed-row ranges
  std::int64_t tasks = 0;            // cells x head groups
  std::int64_t grid_bytes = 0;       // the TaskGrid
  std::int64_t plan_bytes = 0;       // assignment, solver state per task, transfers and the Plan (both passes)
  std::int64_t sim_numeric_bytes = 0;  // the sim executor's fp32 tensors in mode numeric (with its reference)
  // Grid + plan, and the numeric simulation when asked.
  std::int64_t total_bytes(bool sim_numeric) const;
};

// O(slices x log blocks + q blocks spanned by diagonal slices); allocates
// nothing in proportion to the grid. `p` must be valid (Problem::validate).
ResourceEstimate estimate_resources(const Problem& p);
// The same mask and heads over another sharding (the static solver's dispatch).
ResourceEstimate estimate_resources(const Problem& p, const Sharding& sharding);

struct MemoryBudget {
  std::int64_t bytes = 0;  // <= 0: unlimited
  std::string source;      // where it came from, for the error message
};
// CPSCHED_MEMORY_BUDGET, else MemAvailable, else unlimited. Throws Error on a
// malformed CPSCHED_MEMORY_BUDGET.
MemoryBudget default_memory_budget();
// "1073741824", "512M", "16G", "1.5T" (powers of 1024) -> bytes; throws Error
// naming `what` and the text on anything else.
std::int64_t parse_memory_size(std::string_view text, std::string_view what = "memory size");

// Throws LimitError (key "grid.blocks_per_rank" or "cp_size") when the
// estimate needs more than the budget; the message gives the figures, the
// budget's source and what to lower.
void check_resources(const Problem& p, const ResourceEstimate& e, const MemoryBudget& budget,
                     bool sim_numeric = false);
// estimate_resources + check_resources with default_memory_budget().
void check_resources(const Problem& p, bool sim_numeric = false);

// "1.5 GiB"
std::string format_bytes(double bytes);

}  // namespace cpsched
