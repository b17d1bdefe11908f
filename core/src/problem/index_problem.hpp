#pragma once
// Internal: Problem::make of an index mask, for callers that validated the
// mask's entries already (make_index_mask does): the check is one pass over
// every index, and the config path would otherwise run it twice. Not installed.
#include <memory>

#include "cpsched/problem/problem.hpp"

namespace cpsched {

// Problem::make(mask, ...); `validated`: mask->validate() has passed (skipped here).
Problem make_index_problem(std::shared_ptr<const IndexMask> mask, int cp_size, Heads heads, GridOptions grid,
                           bool validated);

}  // namespace cpsched
