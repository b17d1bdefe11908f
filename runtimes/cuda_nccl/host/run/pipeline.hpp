#pragma once
// One rank's execution of its plan on a Backend (docs/plan_format.md), both passes:
//
//   pack + group-cast stage 1 (comm stream); stage 0 attention (compute);
//   for s = 1..N: compute waits for stage s's data; pack + cast stage s+1;
//                 stage s attention; for every stage t whose reduce point is
//                 s: convert its partial results to the wire dtype, and the
//                 comm stream sends them back (group-reduce);
//   compute waits for every reduce and merges (O, lse) or sums (dQ, dK, dV)
//   what came back into the local accumulators, one peer at a time.
//
// Relays (plan.hpp's forwarding phase): after a stage's group-cast the comm
// stream packs the rows the rank relays from its remote tensors and runs the
// forwarding group-cast (receivers take them straight into their remote
// tensors after the first phase's rows). At a reduce point the forwarded
// partials go back first (forwarding group-reduce into staging); a relay's
// compute stream then merges / sums them into its remote accumulators, one
// peer at a time, converts the stage's rows to the wire dtype again, and only
// then does the comm stream send the relay's rows on to their source.
//
// Every rank issues its NCCL groups in this same order (the reduce points are
// the same on every rank), so point-to-point calls always match. All
// metadata (pack/merge segments, attention work lists) is built and uploaded
// once, in the constructor; a pass only enqueues kernels and NCCL calls.
#include <string>
#include <vector>

#include "host/backend/backend.hpp"
#include "host/plan/buffers.hpp"
#include "cpsched/plan/plan.hpp"
#include "host/plan/layout.hpp"
#include "host/plan/transfers.hpp"

namespace cpsched::gpu {

// A rank's shard, all heads, bf16: q and dO [rows x hq x D], k and v [rows x hkv x D].
struct RankInputs {
  std::vector<bf16> q, k, v, d_o;
};

// fp32 results at the shard's rows: o [rows x hq x d_v], lse [rows x hq],
// dq [rows x hq x d_qk], dk [rows x hkv x d_qk] and dv [rows x hkv x d_v]
// (MLA's shared latent: dk is the latent's whole gradient, dv is empty).
struct RankOutputs {
  std::vector<float> o, lse, dq, dk, dv;
};

// Floats per token of each output.
struct OutputWidths {
  std::size_t o, lse, q, k, v;
  std::size_t total() const { return o + lse + q + k + v; }
};
inline OutputWidths output_widths(const HeadLayout& h) {
  const auto hq = static_cast<std::size_t>(h.hq), hkv = static_cast<std::size_t>(h.hkv);
  return {hq * static_cast<std::size_t>(h.dv()), hq, hq * static_cast<std::size_t>(h.dim),
          hkv * static_cast<std::size_t>(h.dim), h.shared ? 0 : hkv * static_cast<std::size_t>(h.dv())};
}

// How a pipeline computes attention: `attention` picks the route of range
// args (sdpa_batches.hpp): automatic (cuDNN where the backend has it and the
// arg fits), cudnn (the same, but a backend without cuDNN is an error) or
// kernels (the runtime's own kernels for every arg).
struct PipelineOptions {
  AttentionMode attention = AttentionMode::automatic;
  int max_band_graphs = SdpaPolicy{}.max_band_graphs;  // bi_causal diagonals with a graph
  i64 min_band_area = SdpaPolicy{}.min_band_area;
};

// Multiply-adds x 2 of a pass's attention args (forward: 4 x area x heads x D;
// backward counted as 2.5 x forward, the usual convention; an index arg's area is
// its entries other than -1).
double pass_flops(const CalcMeta& calc, const Problem& problem, Pass pass);
// The same over the args routed to cuDNN (`routes` of the same calc).
double cudnn_flops(const CalcMeta& calc, const PassRoutes& routes, const Problem& problem, Pass pass);

class RankPipeline {
 public:
  RankPipeline(Backend& be, const RankPlan& plan, const HeadLayout& h, Token local_rows,
               const PipelineOptions& opt = {});

  void set_inputs(const RankInputs& in);  // blocking
  void forward();                         // enqueue; recycles the previous iteration's events
                                          // (read forward_ms / backward_ms before)
  void backward();                        // enqueue; after forward
  void synchronize() { be_.synchronize(); }
  double forward_ms() { return be_.elapsed_ms(pass_[0].t0, pass_[0].t1); }
  double backward_ms() { return be_.elapsed_ms(pass_[1].t0, pass_[1].t1); }
  RankOutputs outputs();                  // after synchronize

  // Timing of the rank's compute alone (no transfer, no wait for one): every
  // stage's attention of a pass back to back, as in a pass (cuDNN batches
  // with their merges / sums, the kernels, the backward's row statistics),
  // or only the cuDNN graphs (`sdpa_only`: cuDNN called directly on the same
  // batches). Overwrites the accumulators: run it after outputs() is read.
  // Returns milliseconds (0 without a clock).
  double time_compute(Pass p, bool sdpa_only);

  const LocalBuffers& local() const { return local_; }
  const BufferSizes& sizes() const { return sizes_; }
  const PassLists& lists(Pass p) const { return lists_[static_cast<int>(p)]; }
  Token local_rows() const { return rows_; }
  // Device bytes of the launch metadata of both passes (work lists, segment
  // tables, the index pools and their transposes), beside sizes().total().
  Bytes metadata_bytes() const { return meta_bytes_; }
  int num_launches(Pass p) const;
  // The cuDNN batches of a pass and where every arg went.
  const PassSdpa& sdpa(Pass p) const { return sdpa_[static_cast<int>(p)]; }
  // Device bytes of the SDPA outputs' packed scratch (0 without cuDNN batches).
  Bytes scratch_bytes() const { return scratch_bytes_; }
  // cuDNN's messages for graphs it could not build (their args went to the kernels).
  const std::vector<std::string>& sdpa_failures() const { return sdpa_failures_; }

 private:
  struct Launch {
    AttnKernel kernel;
    AttnLaunch p;
    Grid grid;
  };
  struct IndexRun {       // an index launch (index_programs.hpp)
    IndexKernel kernel;
    IndexLaunch p;
    Grid grid;
  };
  struct Unpack {         // the segments one peer sent back, in device memory
    const void* segs;
    int n;
  };
  struct SdpaLaunch {     // one cuDNN batch: (bwd: the lse copy,) the graph, then its merges (fwd) or sums (bwd), layer by layer
    int graph = -1;
    SdpaBind bind;
    std::vector<Unpack> layers;
    std::size_t stats_copy = 0;        // arena offset until resolved
    const CopySeg* stats_segs = nullptr;
    int n_stats_copy = 0;
  };
  struct Stage {
    Token qo_off = 0, qo_rows = 0, kv_off = 0, kv_rows = 0;
    int qo_after = 0, kv_after = 0;
    const CopySeg* pack = nullptr;
    int n_pack = 0;
    std::vector<P2POp> cast_ops, qo_reduce_ops, kv_reduce_ops;
    std::vector<Unpack> qo_unpack, kv_unpack;
    // Forwarding phase (relays): pack from the remote tensors, the forwarding
    // cast, and the forwarding reduce with its merges into remote accumulators.
    const CopySeg* fwd_pack = nullptr;
    int n_fwd_pack = 0;
    std::vector<P2POp> fwd_cast_ops, qo_fwd_reduce_ops, kv_fwd_reduce_ops;
    std::vector<Unpack> qo_fwd_unpack, kv_fwd_unpack;
  };
  struct PassPrep {
    RemoteBuffers rb;
    RemoteShape shape;
    std::vector<Stage> stages;                // [s-1]
    std::vector<std::vector<Launch>> launches;  // [s], s = 0..N
    std::vector<std::vector<IndexRun>> index;   // [s]
    std::vector<std::vector<SdpaLaunch>> sdpa;  // [s]
    Program program;                            // the order run_pass issues it all in
    Event t0, t1;
  };

  class PassBuilder;  // prepare()'s per-pass state and steps (pipeline.cpp)

  void prepare(Pass pass, const PassPlan& plan);
  void run_pass(Pass pass);
  void launch_stage(Pass pass, int s, bool sdpa_only);
  // What run_pass keeps while it interprets a pass's program.
  struct PassRun {
    std::vector<Event> cast_done;     // [s]: the comm stream after stage s's last cast
    std::vector<Event> reduce_done;   // one per first-phase reduce
    std::vector<int> wired;           // [2 (t - 1) + kind]: computes run when its partials went to the wire (-1: not)
    int computes = 0;                 // compute instructions run so far
  };
  void issue_cast(PassPrep& pp, int s, Phase phase, PassRun& run);
  void received_delta(const PassPrep& pp, int s);
  void compute_stage(Pass pass, PassPrep& pp, int s);
  void issue_reduce(Pass pass, PassPrep& pp, const Instr& i, PassRun& run);
  void merge_returns(Pass pass, const PassPrep& pp);

  Backend& be_;
  HeadLayout h_;
  Token rows_;
  LocalBuffers local_;
  PassLists lists_[2];
  PassSdpa sdpa_[2];
  BufferSizes sizes_;
  Bytes meta_bytes_ = 0;
  Token tail_ = 0;                   // zero rows after every buffer (SDPA path)
  std::vector<std::string> sdpa_failures_;
  std::uint8_t* scratch_ = nullptr;  // SDPA outputs, packed
  Bytes scratch_bytes_ = 0;
  PassPrep pass_[2];
};

}  // namespace cpsched::gpu
