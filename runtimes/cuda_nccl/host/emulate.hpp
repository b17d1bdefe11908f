#pragma once
// All ranks of a plan in one process, one thread per rank, each a
// RankPipeline on a HostBackend: the CPU run of the exact GPU pipeline.
#include <exception>
#include <vector>

#include "cpsched/plan/plan.hpp"
#include "host_backend.hpp"
#include "pipeline.hpp"

namespace cpsched::gpu {

struct EmulatedRun {
  std::vector<RankOutputs> outputs;  // [rank]
  std::int64_t kernels = 0;          // kernel launches, all ranks, both passes
};

// inputs[r] is rank r's shard. Throws the first rank's error.
// (Rank threads that failed only because another rank aborted are not the cause.)
void rethrow_first_cause(const std::vector<std::exception_ptr>& errors);

EmulatedRun emulate(const Plan& plan, const HeadLayout& h, const std::vector<RankInputs>& inputs,
                    Schedule schedule = Schedule::eager);

}  // namespace cpsched::gpu
