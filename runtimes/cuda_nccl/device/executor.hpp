#pragma once
// The `cuda_nccl` Executor: one process per GPU (mpirun, or the env launch),
// or all ranks emulated on the CPU (backend: emulate).
#include "cpsched/executor.hpp"
#include "cpsched/params.hpp"
#include "host/rank_run.hpp"

namespace cpsched::gpu {

class CudaNcclExecutor final : public Executor {
 public:
  explicit CudaNcclExecutor(const Params& p);
  ExecutionReport execute(const ExecuteInput& in) override;

 private:
  RunOptions opt_;
};

}  // namespace cpsched::gpu
