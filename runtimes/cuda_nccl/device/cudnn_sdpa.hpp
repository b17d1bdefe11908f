#pragma once
// cuDNN's fused attention (SDPA) through the cuDNN frontend's graph API, for
// the batches of host/plan/sdpa_batches.hpp. No cuDNN header here: the build
// compiles cudnn_sdpa.cpp where CMake found cuDNN and its frontend, and
// cudnn_sdpa_none.cpp (which says why not) elsewhere.
//
// Graph of a geometry (forward; backward alike with O, dO and the lse in,
// dQ, dK, dV out): Q [B, Hq, S_q, d], K, V [B, Hkv, S_kv, d] in bf16, ragged
// (a ragged-offset tensor per side: element offsets of each sequence, rows
// q_row_heads * d or k_row_heads * d elements apart, i.e. read in place from
// the runtime's [rows, heads, d] buffers); O packed [T, Hq, d] bf16 and the
// stats packed [T, Hq] fp32 (natural-log LSE), both ragged; per-sequence
// lengths through the padding mask; the mask form's alignment and bounds;
// fp32 softmax and accumulation; scale 1 / sqrt(d). The backward is
// deterministic (cuDNN's deterministic algorithm), and reads the lse from a
// packed copy.
#include <cuda_runtime_api.h>
#include <memory>
#include <string>

#include "host/backend/backend.hpp"
#include "host/plan/sdpa_batches.hpp"

// The path lives in its own shared library (libcpsched_cuda_cudnn.so, beside
// libcpsched): the frontend's headers carry thread-local variables, which a
// plugin must not (test_plugin_lifetime). Only this API is exported.
#define CPSCHED_CUDNN_API __attribute__((visibility("default")))

namespace cpsched::gpu::cudnn {

// Whether this build has the cuDNN path.
CPSCHED_CUDNN_API bool built();
// "cuDNN 9.19.0 (headers 9.19.0), frontend 1.32.0", or why the path is not built.
CPSCHED_CUDNN_API std::string describe_build();

// Builds the graph of `g` as for a device of compute capability `sm_version`
// (90: H100 / H200) and runs the frontend's validate(): no device, no handle.
// Returns "" when the graph passes, else the frontend's message.
CPSCHED_CUDNN_API std::string validate(const SdpaGeometry& g, int sm_version);

// One rank's graphs on its device: a cuDNN handle on `stream`, one graph per
// distinct geometry (built on first use: validate, operation graph,
// heuristics A then fallback, plan), and one workspace, grown to the largest
// graph's. Throws cpsched::Error with cuDNN's message.
class CPSCHED_CUDNN_API Runner {
 public:
  explicit Runner(cudaStream_t stream);
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  int prepare(const SdpaGeometry& g);
  void run(int graph, const SdpaBind& b);  // enqueued on the stream
  SdpaStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cpsched::gpu::cudnn
