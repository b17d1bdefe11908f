#pragma once
// What the pipeline needs from a machine: device memory, the kernels, one
// group of point-to-point calls, and two ordered streams with events. The
// CUDA backend maps this onto CUDA streams, events, kernels and NCCL; the host
// backend (host_backend.hpp) runs the same kernel programs on the CPU and
// moves bytes between rank threads, so the whole pipeline runs in the CPU
// tests. Calls enqueue work and return; `synchronize` waits for all of it.
#include <string>
#include <vector>

#include "cpsched/base/error.hpp"
#include "cpsched/problem/metrics.hpp"
#include "host/plan/sdpa_batches.hpp"
#include "host/plan/worklist.hpp"
#include "host/programs/kernel_params.hpp"

namespace cpsched::gpu {

enum class StreamId : int { compute = 0, comm = 1 };

struct Event {
  int id = -1;
};

// One ncclSend or ncclRecv of `bytes` bytes.
struct P2POp {
  bool send = true;
  Rank peer = 0;
  void* ptr = nullptr;
  Bytes bytes = 0;
};

enum class AttnKernel : int { fwd = 0, dq = 1, dkdv = 2 };
enum class IndexKernel : int { fwd = 0, dq = 1, dkdv = 2 };

// What a backend's SDPA graphs cost so far.
struct SdpaStats {
  int graphs = 0;           // built (distinct geometries)
  double build_s = 0;       // wall time building them
  Bytes workspace = 0;      // the rank's one workspace
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Rank rank() const = 0;
  virtual int world() const = 0;
  virtual std::string describe() const = 0;

  // Device memory, zero-filled, owned by the backend until it dies or
  // `release` returns it (no stream work may be pending on it then).
  virtual void* alloc(Bytes bytes) = 0;
  virtual void release(void* p) = 0;
  // Blocking copies; no stream work may be pending on the memory involved.
  virtual void upload(void* dst, const void* src, Bytes n) = 0;
  virtual void download(void* dst, const void* src, Bytes n) = 0;

  // Kernels. `dim` selects the instantiation (the CUDA backend has 64 and
  // 128; the host backend also 16 and 32 for small tests).
  // dim: d_qk, dim_v: d_v (GQA: equal).
  virtual void attention(AttnKernel k, const AttnLaunch& p, int dim, int dim_v, Grid g) = 0;  // compute stream
  // Index args on tensor cores (index_programs.hpp); compute stream.
  virtual void index_attention(IndexKernel k, const IndexLaunch& p, int dim, int dim_v, Grid g) = 0;
  virtual void copy(StreamId s, const CopySeg* segs, int n) = 0;                   // segs in device memory
  virtual void merge(const MergeSeg* segs, int n) = 0;                             // compute stream
  virtual void sum(const SumSeg* segs, int n) = 0;                                 // compute stream
  virtual void convert(const float* src, bf16* dst, i64 n) = 0;                    // compute stream
  virtual void fill(float* dst, i64 n, float value) = 0;                           // compute stream
  virtual void delta(const bf16* o, const bf16* d_o, float* out, i64 row_heads, int dim) = 0;  // compute

  // cuDNN's fused attention (host/plan/sdpa_batches.hpp). `sdpa_support` is ""
  // when this backend runs SDPA graphs, else why not (the pipeline then keeps
  // every arg on the kernels). `sdpa_prepare` builds the graph of a geometry,
  // or finds the one built before, and returns its id; it runs before any
  // pass (it may grow the rank's one workspace). `sdpa_run` enqueues a graph
  // on the compute stream.
  virtual std::string sdpa_support() const { return "this backend has no cuDNN"; }
  // Why the backend has no attention kernels for these head dims ("" when it
  // has); range_args: some range args run on the runtime's kernels (not only
  // index args).
  virtual std::string kernel_dims_lack(int dim, int dim_v, bool shared, bool range_args) const = 0;
  virtual int sdpa_prepare(const SdpaGeometry& g) {
    throw Error("cuda_nccl (internal): SDPA graph " + gpu::describe(g) + " on a backend without cuDNN");
  }
  virtual void sdpa_run(int, const SdpaBind&) { throw Error("cuda_nccl (internal): SDPA run on a backend without cuDNN"); }
  virtual SdpaStats sdpa_stats() const { return {}; }

  // One ncclGroupStart/ncclGroupEnd of sends and receives on the comm stream.
  virtual void exchange(const std::vector<P2POp>& ops) = 0;

  // Events come from a pool: `record` takes the next free one (creating one
  // only when every pooled event is in use) and `recycle_events` returns them
  // all. Waits already enqueued are not affected by a later record of the
  // same event (they bind to the record they saw), so the pipeline recycles
  // at the start of each iteration, once the previous one's timings are read.
  virtual Event record(StreamId s) = 0;
  virtual void recycle_events() = 0;
  // Events ever created (the pool's size): bounded by one iteration's records.
  virtual int events_created() const = 0;
  virtual void wait(StreamId s, Event e) = 0;  // stream s waits for e
  virtual void synchronize() = 0;
  // Milliseconds between two recorded events (after synchronize); 0 when the
  // backend has no clock (the host emulation).
  virtual double elapsed_ms(Event a, Event b) = 0;
};

}  // namespace cpsched::gpu
