// Solver plugin `balanced_bytes`: the descriptor and its parameter schema.
#include <cpsched/plugin/plugin.hpp>

#include "balanced_bytes.hpp"

namespace {

const cpsched_param_spec kParams[] = {
    {"objective", CPSCHED_PARAM_STRING, "auto",
     "time: predicted step time (fwd + bwd) under a time cost model; bytes: weighted total bytes; bottleneck: the "
     "busiest rank's send or receive, fwd + bwd (the seed's); auto: time when the cost model prices time, else bytes"},
    {"mu", CPSCHED_PARAM_REAL, "1.10",
     "balance cap: max load <= mu x mean (bytes and bottleneck: the target; time: the search's cap, while the "
     "fastest plan is returned, balanced further where that pays, or above mu where that is faster, as the note "
     "says)"},
    {"spread", CPSCHED_PARAM_REAL, "0.25", "time: weight of the mean rank time beside the slowest rank's"},
    {"members", CPSCHED_PARAM_STRING, "auto",
     "solver plugins (comma separated, made by name through the host) whose results are starts of the search and, "
     "in time mode, candidate plans; auto: binary_greedy, and with problem.layout: planned also static and "
     "static:node_ranks=-1+node_chunks=8"},
    {"fwd_weight", CPSCHED_PARAM_REAL, "1.0", "weight of forward bytes in the objective"},
    {"bwd_weight", CPSCHED_PARAM_REAL, "0.0", "weight of backward bytes in the objective"},
    {"bottleneck_weight", CPSCHED_PARAM_REAL, "0.0",
     "objective = total bytes + bottleneck_weight x P x max over ranks of max(send, recv)"},
    {"effort", CPSCHED_PARAM_INT, "0",
     "local-search move evaluations per solve, for grids up to 256 tasks (larger grids get effort x 256 / tasks, "
     "about constant search time); 0: 400000 for bytes and bottleneck, 10000 for time"},
    {"threads", CPSCHED_PARAM_INT, "0",
     "worker threads over the start placements (0: hardware threads, at most 8); same result for any count"},
    {"max_blocks_per_rank", CPSCHED_PARAM_INT, "8",
     "finest sharding tried: bytes, when no placement meets mu on the given grid; time, in the fixed layout "
     "across nodes, where the full solve is repeated on 2 and 4 times the given blocks per rank (1: never)"},
    {"usp_max_degree", CPSCHED_PARAM_INT, "8", "largest Ulysses degree of the usp start (as the usp solver)"},
    {"member_max_tasks", CPSCHED_PARAM_INT, "131072",
     "run the members only on grids of at most this many tasks (their solve time dominates beyond)"},
    {"priced_plans", CPSCHED_PARAM_INT, "4",
     "time: how many candidates (best predicted step first) are built as plans and priced by the timing model; "
     "each costs the host a plan build unless its step bound rules it out"},
    {"settle", CPSCHED_PARAM_REAL, "0.01",
     "time: stop pricing plans once the fastest is within this fraction of the compute bound (all compute / P, "
     "which no plan's step is below: nothing left could be faster by more); 0: price every candidate"},
    {"seed", CPSCHED_PARAM_INT, "1", "seed of the iterated local search's kicks"},
};

}  // namespace

CPSCHED_SOLVER_PLUGIN(cpsched::search::BalancedBytes, "balanced_bytes",
                      "the default: a portfolio (owner, usp and member solvers by name) improved by a local search on the "
                      "predicted step time (time cost model) or the token-granular bytes, under a balance cap; "
                      "splits shards when a cell alone breaks the balance",
                      kParams)
