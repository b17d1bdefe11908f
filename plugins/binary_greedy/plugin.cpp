// Solver plugin `binary_greedy`: the descriptor and its parameter schema.
#include <cpsched/plugin/plugin.hpp>

#include "solver.hpp"

namespace {

const cpsched_param_spec kParams[] = {
    {"mu", CPSCHED_PARAM_REAL, "1.10", "balance target: feasible iff max load <= mu x mean"},
    {"epsilon", CPSCHED_PARAM_REAL, "0.01", "stop the search when hi - lo <= epsilon x hi"},
    {"max_iters", CPSCHED_PARAM_INT, "20", "binary-search iterations at most"},
    {"refine_passes", CPSCHED_PARAM_INT, "5", "stage-3 refinement passes"},
    {"threads", CPSCHED_PARAM_INT, "0",
     "worker threads (0: hardware threads, at most 8; 1: serial); same result for any count"},
};

}  // namespace

CPSCHED_SOLVER_PLUGIN(cpsched::bg::BinaryGreedySolver, "binary_greedy",
                      "the seed's binary search over a per-rank communication threshold with greedy edge "
                      "selection, assignment and refinement (as published)",
                      kParams)
