// Executor plugin `cuda_nccl`: runs plans on GPUs with NCCL (docs/plan_format.md).
#include <cpsched/plugin/plugin.hpp>

#include "cpsched/hardware/profile.hpp"
#include "executor.hpp"

namespace {

const cpsched_param_spec kParams[] = {
    {"backend", CPSCHED_PARAM_STRING, "cuda",
     "cuda: one process per GPU; emulate: every rank on the CPU, same pipeline and kernels (no timing)"},
    {"launch", CPSCHED_PARAM_STRING, "auto",
     "auto, mpi (mpirun), env (RANK, WORLD_SIZE, LOCAL_RANK, CPSCHED_NCCL_ID_FILE), single, or loopback (all P "
     "ranks as threads of one process on device 0, transfers through host memory: checks a plan's results on one "
     "GPU; its times are not a cluster's)"},
    {"plan_source", CPSCHED_PARAM_STRING, "solve_everywhere",
     "solve_everywhere: each rank solves the same mask and keeps its own plan; broadcast: rank 0 sends each rank its plan"},
    {"check", CPSCHED_PARAM_BOOL, "false",
     "also run the plan through the sim runtime on the same inputs and compare O, lse, dQ, dK, dV"},
    {"tolerance", CPSCHED_PARAM_REAL, "0.02", "self-check bound on max |diff| / max |reference| per tensor (bf16)"},
    {"warmup", CPSCHED_PARAM_INT, "1", "untimed forward + backward iterations"},
    {"iterations", CPSCHED_PARAM_INT, "3", "timed forward + backward iterations (medians reported)"},
    {"seed", CPSCHED_PARAM_INT, "0", "seed of the generated Q, K, V, dO (0: the run's seed)"},
    {"threads", CPSCHED_PARAM_INT, "0", "CPU threads of the self-check's sim run (0: all cores)"},
    {"attention", CPSCHED_PARAM_STRING, "auto",
     "range args: auto (cuDNN's fused attention where it is built and takes the arg, else the runtime's kernels), "
     "cudnn (the same; a missing cuDNN is an error) or kernels (the runtime's own kernels only)"},
    {"compute_timing", CPSCHED_PARAM_BOOL, "false",
     "after the iterations, each rank in turn times its compute alone (every stage's attention back to back, no "
     "transfers) and cuDNN's graphs alone on the same batches"},
    {"hardware", CPSCHED_PARAM_STRING, cpsched::kDefaultHardwareProfile,
     "hardware profile whose kernel model's predicted compute per rank and pass is printed beside the measured "
     "times (when the profile has a kernel table): a bundled name or a YAML file"},
    {"schedule", CPSCHED_PARAM_STRING, "eager",
     "emulation only: eager, lazy_comm or lazy_compute (delays one stream to expose missing waits)"},
};

}  // namespace

CPSCHED_EXECUTOR_PLUGIN(cpsched::gpu::CudaNcclExecutor, "cuda_nccl",
                        "GPU runtime: range args on cuDNN's fused attention, index args on tensor cores, the runtime's "
                        "own kernels for the rest (bf16, fp32 accumulation), NCCL group-cast/group-reduce with stage "
                        "pipelining; self-check against the sim runtime",
                        kParams)
