#pragma once
// Range args on cuDNN's fused attention (SDPA): which args go there, and how
// a stage's args become ragged (THD) batches, one SDPA call each.
//
// Route (per arg, `choose_routes`): an arg runs on cuDNN when the backend has
// it, the attention mode allows it, the heads are bf16 GQA with a head dim
// cuDNN takes (a multiple of 8, at most 256), it is a range arg (index args
// run on the runtime's index kernels) and, for bi_causal, its diagonal is one
// of the few worth a graph (below). Everything else stays on the runtime's
// own kernels; `RouteSummary` counts args and area each way, by reason.
//
// Mask forms. An arg's type is anchored to its rectangle (docs/plan_format.md):
// with i, j the row and col inside it and Lq, Lk its sides,
//   full        every (i, j)
//   causal      j - i <= Lk - Lq          cuDNN: BOTTOM_RIGHT, right bound 0
//   inv_causal  j - i >= 0                cuDNN: TOP_LEFT, left bound 1
//   bi_causal   0 <= j - i <= Lk - Lq     cuDNN: TOP_LEFT, left bound 1, right bound Lk - Lq
// (cuDNN, docs/operations/Attention.md: the right bound masks cols beyond
// row + right, the left bound cols at or before row - left, the row shifted by
// s_kv - s_q per sequence under BOTTOM_RIGHT). bi_causal's right bound is a
// graph attribute, so it takes one graph per Lk - Lq: the kMaxBandGraphs
// diagonals with the most area (at least kMinBandArea each) get one, the rest
// run on the runtime's kernels.
//
// Rows no key reaches. cuDNN's documentation does not say what O and LSE it
// writes for a query row whose keys are all masked (and releases differ), so
// no such row ever reaches it: each arg is clipped to the rows and cols of its
// band that hold entries (`band_rows`, `band_cols`). That keeps the form
// (a causal arg loses only leading rows, an inv_causal one trailing rows; the
// diagonal's anchor does not move) and every row of every sequence has a key.
//
// Batches. Per stage, the cuDNN args are grouped by (q buffer, k buffer, head
// group, form, bi_causal diagonal), in arg order; each arg is one sequence.
// Q, K, V (and, backward, O, dO and the lse, the merged ones) are read in
// place through ragged offsets: a sequence's rows are contiguous in the
// buffer, at any offset, and sequences may overlap. Outputs go to a packed
// scratch (O and lse, or dQ, dK and dV, sequence after sequence), which the
// existing fp32 merge and sum fold into the accumulators. Graph geometry is
// bucketed (batch size and longest sequence to powers of two, padded with
// one-row dummy sequences whose outputs nobody reads) so that stages share
// graphs.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "buffers.hpp"
#include "cpsched/plan/plan.hpp"
#include "host/programs/kernel_params.hpp"
#include "layout.hpp"

namespace cpsched::gpu {

// cuDNN's mask forms (the project's types, see above).
enum class SdpaMask : std::int32_t { full = 0, causal = 1, inv_causal = 2, bi_causal = 3 };
std::string_view to_string(SdpaMask m);

// What a graph depends on (its cache key): the graph is built once per distinct value.
struct SdpaGeometry {
  Pass pass = Pass::fwd;
  SdpaMask mask = SdpaMask::full;
  i64 band = 0;                 // bi_causal: Lk - Lq (its right bound); 0 otherwise
  int batch = 0;                // sequences (B), bucketed
  int q_heads = 0, kv_heads = 0, dim = 0;
  i64 max_q = 0, max_k = 0;     // longest sequence (S dims), bucketed
  i64 q_row_heads = 0;          // heads per row of the in-place q-side buffers (stride)
  i64 k_row_heads = 0;
  i64 q_capacity = 0;           // backward: rows of the in-place buffers, tail included (bounds its
  i64 k_capacity = 0;           // workspace); 0 forward, whose graph does not depend on them
  float scale = 1.f;
  friend bool operator==(const SdpaGeometry&, const SdpaGeometry&) = default;
};
std::string describe(const SdpaGeometry& g);

// The cuDNN form of each mask form: alignment and bounds (-1: no bound).
struct SdpaBounds {
  bool bottom_right = false;
  i64 left = -1, right = -1;
};
SdpaBounds sdpa_bounds(SdpaMask m, i64 band);

// One sequence: an arg's clipped rectangle in buffer rows, and where its
// outputs go in the packed scratch (rows of q_heads / kv_heads heads).
struct SdpaSeq {
  i64 q_row = 0, q_len = 0;
  i64 k_row = 0, k_len = 0;
  i64 out_q = 0, out_k = 0;
  i64 area = 0;                 // entries per head
  std::int32_t arg = -1;        // index in the stage's args (-1: a bucketing dummy)
};

struct SdpaBatch {
  int stage = 0;
  BufferId q_buf = BufferId::local, k_buf = BufferId::local;
  int group = -1;
  int q_head_off = 0, k_head_off = 0;  // first head of the batch inside a buffer row
  i64 q_rows = 0, k_rows = 0;          // rows of the two buffers (their zero tail rows follow)
  SdpaGeometry geo;
  std::vector<SdpaSeq> seqs;    // real ones first, then dummies
  int real = 0;                 // real sequences
  i64 total_q = 0, total_k = 0; // packed rows (dummies included)
  i64 area = 0;                 // entries per head, real sequences
};

// Why an arg runs where it runs.
enum class RouteReason : std::uint8_t {
  cudnn,          // on cuDNN
  index_arg,      // token top-k: the runtime's index kernels
  mode,           // attention mode `kernels`
  no_cudnn,       // the backend has no cuDNN (not built, or none on the device)
  heads,          // not bf16 GQA with a head dim cuDNN takes
  rare_band,      // a bi_causal diagonal without a graph
  offsets,        // ragged offsets beyond 32 bits
  graph,          // cuDNN could not build its batch's graph (automatic mode)
  empty,          // no entries (nothing to run)
  index_rows,     // MLA range arg: each row's keys as index rows on the index kernels
};
inline constexpr int kNumRouteReasons = 10;
std::string_view to_string(RouteReason r);

struct RouteSummary {
  std::array<i64, kNumRouteReasons> args{};
  std::array<i64, kNumRouteReasons> area{};  // entries per head (index args: selected pairs)
  i64 cudnn_args() const { return args[0]; }
  i64 cudnn_area() const { return area[0]; }
  i64 kernel_args() const;
  i64 kernel_area() const;
  void add(const RouteSummary& o);
  std::string text() const;  // "cuDNN 12 args (93.1% of area), kernels 3 (6.9%: index_arg 3)"
};

enum class AttentionMode : std::uint8_t { automatic, cudnn, kernels };
std::string_view to_string(AttentionMode m);

// Choices and limits of the routing.
struct SdpaPolicy {
  AttentionMode mode = AttentionMode::automatic;
  std::string backend_lacks;    // non-empty: the backend has no cuDNN, and why
  int max_band_graphs = 4;      // bi_causal diagonals with a graph, per pass
  i64 min_band_area = 16384;    // ... each covering at least this many entries per head
  int min_bucket = 64;          // smallest bucketed S
  // [stage][arg]: args whose batch's graph cuDNN could not build (they run
  // on the kernels; the pipeline fills it when a graph fails to build).
  std::vector<std::vector<bool>> no_graph;
};

// Zero rows after every in-place buffer the SDPA path reads: bucketing's
// dummy sequences read them, and a kernel that loads whole tiles past a
// sequence's end still reads finite numbers inside the allocation.
inline constexpr Token kSdpaTailRows = 128;

// Why cuDNN cannot take these heads ("" when it can): bf16 (2-byte) GQA,
// d_qk = d_v a multiple of 8 and at most 256, K and V apart.
std::string sdpa_heads_reason(int dim_qk, int dim_v, bool kv_shared, int dtype_bytes);

// MLA heads (d_qk != d_v, or a shared latent) run their range args on the
// index kernels (tensor cores, the latent read once per key), each row's keys
// given as index rows (index_worklist.hpp); cuDNN's SDPA takes no MLA.
inline bool range_args_as_index_rows(const HeadLayout& h) { return h.is_mla(); }

// Per arg of every stage of a pass (stage 0 = local args): the route.
struct PassRoutes {
  std::vector<std::vector<RouteReason>> reason;  // [stage][arg]
  RouteSummary summary;
};
// `shape` and `local_rows`: the pass's buffers (args are checked against
// them; an in-place buffer too large for 32-bit offsets keeps its args off
// cuDNN). Throws cpsched::Error naming a malformed arg.
PassRoutes choose_routes(const CalcMeta& calc, const HeadLayout& h, const SdpaPolicy& pol, const RemoteShape& shape,
                         Token local_rows);

// A pass's cuDNN batches and the args left to the runtime's kernels.
struct PassSdpa {
  PassRoutes routes;
  std::vector<std::vector<SdpaBatch>> batches;      // [stage]
  std::vector<std::vector<AttnArg>> kernel_args;    // [stage], in arg order
  i64 max_total_q = 0, max_total_k = 0;             // packed rows of the largest batch (both sides' max)
  i64 max_q_heads = 0, max_kv_heads = 0;
};
// `local_rows`: the rank's shard; `shape`: the pass's remote buffers.
PassSdpa plan_sdpa(const PassPlan& plan, Pass pass, const HeadLayout& h, const RemoteShape& shape, Token local_rows,
                   const SdpaPolicy& pol);

// Packed scratch of one batch, bytes, each part 16-byte aligned (fwd: O bf16,
// then lse fp32; bwd: dQ, dK, dV bf16, then the copy of the lse).
struct SdpaScratch {
  Bytes o = 0, stats = 0, dq = 0, dk = 0, dv = 0;  // offsets
  Bytes bytes = 0;
};
SdpaScratch sdpa_scratch(const SdpaBatch& b);

// Ragged offsets and sequence lengths of one batch, int32 (each B + 1
// entries but seq_q / seq_k, B). Offsets count elements from the batch's
// base pointers.
struct SdpaOffsets {
  std::vector<std::int32_t> q, k;                     // in place: q-side tensors (Q, O, dO), k-side (K, V)
  std::vector<std::int32_t> out_q, out_stats, out_k;  // packed: O or dQ, the lse, dK and dV
  std::vector<std::int32_t> seq_q, seq_k;
};
SdpaOffsets sdpa_offsets(const SdpaBatch& b);

// Device pointers of one SDPA call (null where a pass has no such tensor).
struct SdpaBind {
  const bf16 *q = nullptr, *k = nullptr, *v = nullptr;    // in place, at the batch's first head
  const bf16 *o = nullptr, *d_o = nullptr;                 // bwd, in place: the merged O, and dO
  const float* stats = nullptr;                            // bwd, packed: a copy of the merged lse
  bf16* out_o = nullptr;                                   // fwd, packed
  float* out_stats = nullptr;                              // fwd, packed
  bf16 *dq = nullptr, *dk = nullptr, *dv = nullptr;        // bwd, packed
  const std::int32_t *q_off = nullptr, *k_off = nullptr;
  const std::int32_t *out_q_off = nullptr, *out_stats_off = nullptr, *out_k_off = nullptr;  // stats: both passes
  const std::int32_t *seq_q = nullptr, *seq_k = nullptr;
};

// Launch layers: segments of one layer write disjoint accumulator rows (a
// merge or sum launch runs its segments in parallel). `targets[i]` is the
// rows x heads a segment writes; returns the layer of each, first fit.
struct Footprint {
  i64 row_b = 0, row_e = 0;
  int head_b = 0, head_e = 0;
};
std::vector<int> disjoint_layers(const std::vector<Footprint>& targets);

}  // namespace cpsched::gpu
