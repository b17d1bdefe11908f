#pragma once
// Stage 3: bounded refinement. In each pass, every task (in stage-2 order)
// on a rank whose load is at least mu x mean moves to the allowed rank that
// minimises (its load + the task's compute), if that is strictly below the
// current rank's load.
#include <cstdint>
#include <vector>

#include <cpsched/problem/problem.hpp>

#include "rank_mask.hpp"

namespace cpsched::bg {

struct Instance;

template <int W>
void refine(const Instance& in, const std::vector<Word>& masks, const std::vector<std::int32_t>& order,
            const std::vector<std::uint16_t>& degree, double max_load, int passes, std::vector<Rank>& rank, std::vector<double>& load);

}  // namespace cpsched::bg
