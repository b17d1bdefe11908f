#include "executor.hpp"

#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "cuda_backend.hpp"
#include "host/bootstrap/bootstrap.hpp"
#include "kernels.hpp"

namespace cpsched::gpu {

CudaNcclExecutor::CudaNcclExecutor(const Params& p) : opt_(parse_run_options(p)) {}

ExecutionReport CudaNcclExecutor::execute(const ExecuteInput& in) {
  if (!in.problem || in.plan == nullptr) throw Error("cuda_nccl: execute needs a problem and a plan");
  const Problem& problem = *in.problem;
  const Plan& plan = *in.plan;
  const std::uint64_t seed = opt_.seed != 0 ? opt_.seed : in.seed;
  if (opt_.backend == "emulate") return run_emulated(problem, plan, opt_, seed);
  // MLA's kernels are checked per plan (its routes) by every rank's pipeline.
  if (problem.heads.is_gqa() && !cuda::has_attention_kernel(problem.heads.dim))
    throw Error(fmt::format("cuda_nccl: head dim {} has no CUDA kernel (built: 64, 128)", problem.heads.dim));
  if (opt_.launch == "loopback")
    return run_in_process(problem, plan, opt_, seed, [](HostWorld& world, Rank r) {
      return make_cuda_loopback_backend(world, r, 0);
    });
  if (!bootstrap_) bootstrap_ = make_bootstrap(opt_.launch, process_env());
  auto backend = make_cuda_backend(*bootstrap_);
  return run_rank(*backend, problem, plan, opt_, seed);
}

}  // namespace cpsched::gpu
