#pragma once
// The single-device dense reference: the sim kernel over every slice of the
// whole mask on the global tensors, partials merged with the lse merge, then
// the backward pass from the final O and lse. (The kernel itself is checked
// against a naive O(S^2) double reference in the unit tests.)
#include "cpsched/problem/problem.hpp"
#include "global_tensors.hpp"

namespace cpsched::sim {

GlobalOutputs dense_reference(const Problem& p, const GlobalInputs& in, int threads);

}  // namespace cpsched::sim
