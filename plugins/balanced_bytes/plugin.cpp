// Solver plugin `balanced_bytes`: the descriptor and its parameter schema.
#include <cpsched/plugin.hpp>

#include "balanced_bytes.hpp"

namespace {

const cpsched_param_spec kParams[] = {
    {"mu", CPSCHED_PARAM_REAL, "1.10", "balance target: max load <= mu x mean"},
    {"fwd_weight", CPSCHED_PARAM_REAL, "1.0", "weight of forward bytes in the objective"},
    {"bwd_weight", CPSCHED_PARAM_REAL, "0.0", "weight of backward bytes in the objective"},
    {"bottleneck_weight", CPSCHED_PARAM_REAL, "0.0",
     "objective = total bytes + bottleneck_weight x P x max over ranks of max(send, recv)"},
    {"effort", CPSCHED_PARAM_INT, "400000",
     "local-search move evaluations per solve, for grids up to 256 tasks; larger grids get effort x 256 / "
     "tasks (about constant search time)"},
    {"threads", CPSCHED_PARAM_INT, "0",
     "worker threads over the start placements (0: hardware threads, at most 8); same result for any count"},
    {"max_blocks_per_rank", CPSCHED_PARAM_INT, "8",
     "finest sharding tried when no placement meets mu on the given grid"},
    {"usp_max_degree", CPSCHED_PARAM_INT, "8", "largest Ulysses degree of the usp start (as the usp solver)"},
    {"binary_greedy", CPSCHED_PARAM_BOOL, "true", "also start from the seed's binary_greedy result"},
    {"binary_greedy_max_tasks", CPSCHED_PARAM_INT, "4096",
     "run binary_greedy only on grids of at most this many tasks (its solve time dominates beyond)"},
    {"seed", CPSCHED_PARAM_INT, "1", "seed of the iterated local search's kicks"},
};

}  // namespace

CPSCHED_SOLVER_PLUGIN(cpsched::bytes::BalancedBytes, "balanced_bytes",
                      "portfolio (owner, usp, binary_greedy) improved by a local search on the token-granular "
                      "bytes under the balance cap; splits shards when a cell alone breaks the balance",
                      kParams)
