#pragma once
// Numeric execution of a plan on P virtual ranks in one process. Each rank
// owns copies of its shard of Q, K, V, dO and its own receive buffers; data
// crosses ranks only through the routes of the plan's CommMeta (group-cast
// copies, group-reduce merges or sums), so a missing, extra or misplaced
// transfer changes the result. Receive buffers start as NaN: reading a row
// that no transfer delivered poisons the outputs.
#include <cstdint>

#include "cpsched/plan/plan.hpp"
#include "cpsched/plan/program.hpp"
#include "cpsched/problem/problem.hpp"
#include "global_tensors.hpp"
#include "routing.hpp"

namespace cpsched::sim {

struct VirtualRun {
  GlobalOutputs outputs;  // every rank's results at their global tokens (gathered to compare only)
  Faults faults;          // plan faults met while executing
  std::int64_t args_run = 0;
  std::int64_t rows_moved = 0;  // rows copied by group-casts (both passes)
  Program ran[2];               // per pass: the instructions run, in order (the plan's program)
};

// threads: 0 = all cores. Throws cpsched::Error only when the plan cannot be
// run at all (rank count, sharding); other defects become faults.
VirtualRun run_virtual_ranks(const Problem& problem, const Plan& plan, const GlobalInputs& in, int threads);

}  // namespace cpsched::sim
