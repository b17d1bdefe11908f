#pragma once
// The `cuda_nccl` Executor: one process per GPU (mpirun, or the env launch),
// all ranks as threads on device 0 (launch: loopback), or all ranks emulated
// on the CPU (backend: emulate).
#include <memory>

#include "cpsched/plugin/executor.hpp"
#include "cpsched/plugin/params.hpp"
#include "host/bootstrap/bootstrap.hpp"
#include "host/run/rank_run.hpp"

namespace cpsched::gpu {

class CudaNcclExecutor final : public Executor {
 public:
  explicit CudaNcclExecutor(const Params& p);
  ExecutionReport execute(const ExecuteInput& in) override;

 private:
  RunOptions opt_;
  // Made at the first execution and kept: MPI can be initialised once per
  // process, and is finalised when the executor goes.
  std::unique_ptr<Bootstrap> bootstrap_;
};

}  // namespace cpsched::gpu
