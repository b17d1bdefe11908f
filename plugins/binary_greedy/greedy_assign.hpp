#pragma once
// Stage 2, second half: place the tasks in stage-2 order. A local task stays
// on its host; else the USP-affinity rank if allowed and its load is below
// the mean; else the q host if allowed and below the mean; else the least
// loaded allowed rank (lowest index on ties).
#include <cstdint>
#include <vector>

#include <cpsched/problem/problem.hpp>

#include "rank_mask.hpp"

namespace cpsched::bg {

struct Instance;

template <int W>
void assign_greedy(const Instance& in, const std::vector<Word>& masks, const std::vector<std::int32_t>& order,
                   const std::vector<std::uint16_t>& degree, std::vector<Rank>& rank, std::vector<double>& load);

}  // namespace cpsched::bg
