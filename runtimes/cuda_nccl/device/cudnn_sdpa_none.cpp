// The cuDNN path where the build has no cuDNN (cudnn_sdpa.hpp): every call
// says so, and the backend keeps every arg on the runtime's kernels.
#include "cudnn_sdpa.hpp"

#include "cpsched/base/error.hpp"

#ifdef CPSCHED_CUDNN_MISSING_HEADER
#include "cudnn_missing.hpp"
#endif
#ifndef CPSCHED_CUDNN_MISSING
#define CPSCHED_CUDNN_MISSING "cuDNN was not found at configure time"
#endif

namespace cpsched::gpu::cudnn {

bool built() { return false; }
std::string describe_build() { return "not built: " CPSCHED_CUDNN_MISSING; }
std::string validate(const SdpaGeometry&, int) { return describe_build(); }

struct Runner::Impl {};
Runner::Runner(cudaStream_t) { throw Error("cuda_nccl: cuDNN's attention is " + describe_build()); }
Runner::~Runner() = default;
int Runner::prepare(const SdpaGeometry&) { throw Error("cuda_nccl: cuDNN's attention is " + describe_build()); }
void Runner::run(int, const SdpaBind&) { throw Error("cuda_nccl: cuDNN's attention is " + describe_build()); }
SdpaStats Runner::stats() const { return {}; }

}  // namespace cpsched::gpu::cudnn
