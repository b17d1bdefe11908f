#pragma once
// All ranks of a plan in one process, one thread per rank, each a
// RankPipeline on a HostBackend: the CPU run of the exact GPU pipeline.
#include <exception>
#include <functional>
#include <vector>

#include "cpsched/plan/plan.hpp"
#include "host/backend/host_backend.hpp"
#include "pipeline.hpp"

namespace cpsched::gpu {

struct EmulatedRun {
  std::vector<RankOutputs> outputs;  // [rank]
  std::int64_t kernels = 0;          // kernel launches, all ranks, both passes
  RouteSummary routes[2];            // [fwd, bwd], all ranks
};

// Throws the first rank's error. (Rank threads that failed only because
// another rank aborted are not the cause.)
void rethrow_first_cause(const std::vector<std::exception_ptr>& errors);

// body(r) for every rank r of `world`, each on its own thread (ranks wait on
// each other in its collectives). A rank that throws, or whose thread the
// system refuses to start, aborts the world, which wakes the ranks waiting on
// it; once all have stopped the first cause is rethrown. Never a hang, never
// std::terminate.
void run_rank_threads(HostWorld& world, int ranks, const std::function<void(Rank)>& body);

// inputs[r] is rank r's shard. Throws the first rank's error.

// `opt.attention`: automatic runs range args through the CPU twin of cuDNN's
// SDPA (sdpa_twin.hpp), kernels on the runtime's own kernel programs.
EmulatedRun emulate(const Plan& plan, const HeadLayout& h, const std::vector<RankInputs>& inputs,
                    Schedule schedule = Schedule::eager, const PipelineOptions& opt = {});

}  // namespace cpsched::gpu
