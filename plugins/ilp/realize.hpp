#pragma once
// From the aggregated model's counts (how many head groups of each cell run on
// each rank) to a per-group placement: which groups go where is free, and the
// bytes depend on it (tasks of one group on one rank share their segments).
// A layout pass, then improving swaps of two groups of one cell between their
// ranks (loads do not change), from several deterministic starts.
#include <cstdint>
#include <vector>

#include "cpsched/search/byte_model.hpp"

namespace cpsched::ilp {

// counts[c * P + r] = groups of cell c on rank r (each cell's counts add up
// to G). Returns the placement with the lowest objective found.
// The State objective decides (bottleneck_weight as in search::State).
std::vector<Rank> realize(const search::ByteModel& m, const std::vector<int>& counts, int starts,
                          double bottleneck_weight);

}  // namespace cpsched::ilp
