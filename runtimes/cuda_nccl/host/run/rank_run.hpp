#pragma once
// What the `cuda_nccl` executor does on each rank, whatever the Backend:
// take its own RankPlan (solved locally, or scattered by rank 0), generate its
// shard of the seeded inputs, run warm-up and timed iterations of forward +
// backward, gather the per-rank figures (and, with `check`, the outputs) to
// rank 0, and report. Rank 0's report holds the whole table; the others
// report themselves and the check's verdict.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "host/backend/backend.hpp"
#include "cpsched/plugin/executor.hpp"
#include "cpsched/plugin/params.hpp"
#include "cpsched/hardware/profile.hpp"
#include "host/backend/host_backend.hpp"
#include "host/plan/sdpa_batches.hpp"

namespace cpsched::gpu {

struct RunOptions {
  std::string backend = "cuda";            // cuda | emulate
  std::string launch = "auto";             // auto | mpi | env | single | loopback
  std::string plan_source = "solve_everywhere";  // solve_everywhere | broadcast
  bool check = false;
  double tolerance = 2e-2;
  int warmup = 1;
  int iterations = 3;
  std::uint64_t seed = 0;                  // 0: the ExecuteInput's seed
  int threads = 0;                         // CPU threads of the self-check's sim run (0: all)
  Schedule schedule = Schedule::eager;     // emulation only
  AttentionMode attention = AttentionMode::automatic;  // range args: cuDNN where possible, or own kernels
  // After the iterations (and the check): each rank in turn, the others
  // waiting, times its compute alone (every stage's attention of a pass back
  // to back, no transfer) and cuDNN's graphs alone on the same batches.
  bool compute_timing = false;
  // Hardware profile whose kernel model predicts each rank's compute (printed
  // beside the measured times when the profile has a kernel table).
  std::string hardware = kDefaultHardwareProfile;
};

// Reads and validates the executor's parameters; errors name the parameter.
RunOptions parse_run_options(const Params& p);

// Runs rank be.rank() of `plan` (the executor's job on one process or one
// emulated rank). With plan_source = broadcast only rank 0 reads
// `plan.ranks`; the others use what it sends.
ExecutionReport run_rank(Backend& be, const Problem& problem, const Plan& plan, const RunOptions& opt,
                         std::uint64_t seed);

// All ranks of `plan` as threads of this process, rank r on the Backend
// `make(world, r)` returns; rank 0's report, `passed` only when every rank
// passed. A rank that fails aborts the world, so that no other rank waits.
using RankBackendFactory = std::function<std::unique_ptr<Backend>(HostWorld& world, Rank rank)>;
ExecutionReport run_in_process(const Problem& problem, const Plan& plan, const RunOptions& opt, std::uint64_t seed,
                               const RankBackendFactory& make);

// run_in_process on HostBackends: the CPU emulation.
ExecutionReport run_emulated(const Problem& problem, const Plan& plan, const RunOptions& opt, std::uint64_t seed);

}  // namespace cpsched::gpu
