#pragma once
// A problem: the mask, how tokens are sharded over P ranks, the attention heads
// and the grid options (docs/design.md#vocabulary, docs/architecture.md#data-flow).
#include <cstdint>
#include <vector>

#include <memory>

#include "cpsched/base/buffer_recycler.hpp"
#include "cpsched/mask/index/cells.hpp"
#include "cpsched/mask/index/index_mask.hpp"
#include "cpsched/mask/index/summary.hpp"
#include "cpsched/mask/mask.hpp"
#include "cpsched/base/range.hpp"

namespace cpsched {

using Rank = std::int32_t;

// Head geometry: GQA (hq : hkv : D) or MLA. MLA in MQA mode (DeepSeek's DSA)
// has one latent KV row per token shared by K and V: K is the latent (dim
// = d_qk), V its first d_v dims. Every byte and FLOP count goes through the
// helpers below so that Q, O, K and V rows carry their true sizes.
struct Heads {
  int q = 64;              // hq
  int kv = 8;              // hkv
  int dim = 128;           // d_qk: Q and K (D under GQA)
  int dtype_bytes = 2;     // b (bf16)
  int dim_v = 0;           // d_v: V, O, dO; 0 = same as dim
  bool kv_shared = false;  // K and V are one latent row of dim (d_v <= d_qk)

  int dqk() const { return dim; }
  int dv() const { return dim_v > 0 ? dim_v : dim; }
  // True when the geometry is plain GQA (d_v = d_qk, K and V apart).
  bool is_gqa() const { return dv() == dim && !kv_shared; }
  // Bytes of one token row of one head.
  std::int64_t q_row_bytes() const { return std::int64_t{dim} * dtype_bytes; }
  std::int64_t o_row_bytes() const { return std::int64_t{dv()} * dtype_bytes; }  // also dO
  std::int64_t k_row_bytes() const { return std::int64_t{dim} * dtype_bytes; }   // the latent when shared
  std::int64_t v_row_bytes() const { return kv_shared ? 0 : std::int64_t{dv()} * dtype_bytes; }
  std::int64_t kv_row_bytes() const { return k_row_bytes() + v_row_bytes(); }
  static constexpr std::int64_t lse_bytes() { return 4; }  // fp32, per q head
  // FLOPs per (query, key) pair per q head: QK^T (2 d_qk) and PV (2 d_v)
  // forward (4 D under GQA); backward recomputes QK^T and adds dP = dO V^T,
  // dV, dQ, dK: 6 d_qk + 4 d_v (2.5x the forward under GQA).
  double fwd_flops_per_pair() const { return 2.0 * dim + 2.0 * dv(); }
  double bwd_flops_per_pair() const { return 6.0 * dim + 4.0 * dv(); }
  friend bool operator==(const Heads&, const Heads&) = default;
  // bwd / fwd: exactly 2.5 under GQA, so GQA prices stay bit-identical.
  double bwd_flops_ratio() const { return bwd_flops_per_pair() / fwd_flops_per_pair(); }
};

struct GridOptions {
  bool flatten_head_groups = true;
  int blocks_per_rank = 1;
  friend bool operator==(const GridOptions&, const GridOptions&) = default;
};

// Which tokens each rank hosts, as an ordered list of blocks. Block b covers
// `blocks[b]` and lives on rank `host[b]`. Blocks are sorted by position and
// tile [0, S). A rank's local buffer is the concatenation of its blocks in
// block order.
struct Sharding {
  int cp_size = 0;
  std::vector<Range> blocks;
  std::vector<Rank> host;

  // Rank p hosts [p*S/P, (p+1)*S/P); the first S mod P ranks get one token
  // more. Each shard is cut into `blocks_per_rank` contiguous blocks the same way.
  static Sharding sequential(Token seqlen, int cp_size, int blocks_per_rank = 1);
  // Blocks given explicitly (e.g. the static solver's dispatched chunks).
  static Sharding dispatched(int cp_size, std::vector<Range> blocks, std::vector<Rank> host);
  // The layout a caller's tokens already have: per rank the global ranges it
  // holds (a plan's host_ranges, the step's dispatch). They must tile
  // [0, seqlen) without overlap; each maximal range is a block. Throws
  // cpsched::Error naming the rank and range at fault.
  static Sharding of_host_ranges(Token seqlen, const std::vector<std::vector<Range>>& host_ranges);
  // The same tokens on the same ranks (whatever the cut into blocks).
  bool same_layout(const Sharding& o) const;

  int num_blocks() const { return static_cast<int>(blocks.size()); }
  RangeSet rank_tokens(Rank r) const;       // what rank r hosts, global coords
  std::vector<RangeSet> all_rank_tokens() const;
  int block_of(Token t) const;              // binary search; -1 if outside
  void validate(Token seqlen) const;        // tiles [0, S) in order, hosts in range
};

// Who decides where the tokens live during the attention call.
//  * fixed: the shards as they are (sequential, or the host ranges given):
//    the activations earlier layers produced. Every per-layer mask (DSA, NSA,
//    any runtime mask) is planned so. Solvers may move work, not tokens.
//  * planned: the solver may choose the layout (MagiAttention's dispatch). Only
//    for a mask known before the step and shared by its layers (documents
//    packed in the data loader); the caller then lays the inputs out as the
//    plan's host_ranges say, and undoes it at the loss.
enum class Layout : std::uint8_t { fixed = 0, planned = 1 };
inline const char* to_string(Layout l) { return l == Layout::fixed ? "fixed" : "planned"; }

struct Problem {
  // The mask: range slices, or (index masks, index_mask.hpp) `mask` holds
  // only S and one of the two below says which pairs are selected.
  RangeMask mask;
  // Token top-k selections (kind topk): cells from count_index_cells, plan
  // args as index args (plan.hpp).
  std::shared_ptr<const IndexMask> index_mask;
  // Its sorted rows, shared by the problem's grids (set by make).
  std::shared_ptr<const SelectionRowsCache> selection_rows;
  // Token top-k selections known from the ranks' summaries instead
  // (per-rank ingestion, mask/index/summary.hpp): the grids' cells come from
  // it, and selection_rows holds this rank's own rows only, so only this
  // rank's plan can be built, of placements that compute every query on its
  // host (owner's).
  std::shared_ptr<const IndexSummary> index_summary;
  // With a summary: this rank's row runs instead of its rows (Problem::make
  // of row runs). Its plan's index args then have their shapes but the
  // executor writes their rows (CalcMeta::deferred_index_entries).
  std::shared_ptr<const TopkRowRuns> index_row_runs;
  // The queries whose index rows this problem holds (rows or row runs of a
  // summary's rank); empty for a whole mask.
  Range own_index_queries() const;
  bool index_topk() const { return index_mask != nullptr || index_summary != nullptr; }
  // Per KV head range masks (block selections of several heads, converted by
  // block_selection_masks): head group g of a flattened grid uses
  // head_masks[g]; empty: `mask` for every head.
  std::vector<RangeMask> head_masks;
  Heads heads;
  GridOptions grid;
  Sharding sharding;
  Layout layout = Layout::fixed;

  int cp_size() const { return sharding.cp_size; }
  Token seqlen() const { return mask.seqlen(); }
  // Head groups scheduled independently: hkv when flattened, else 1.
  int num_groups() const { return grid.flatten_head_groups ? heads.kv : 1; }
  int q_heads_per_task() const { return heads.q / num_groups(); }
  int kv_heads_per_task() const { return heads.kv / num_groups(); }

  // Checks P >= 1, heads divide, D, b > 0, d_v >= 0 (<= D when KV is shared),
  // the mask and the sharding.
  // Throws cpsched::Error naming the offending value.
  void validate() const;

  // The layout (and, when `host_ranges` is not empty, the shards the tokens
  // already have instead of the sequential ones: one list of global ranges
  // per rank, blocks_per_rank must then be 1). Throws cpsched::Error.
  void set_layout(Layout l, const std::vector<std::vector<Range>>& host_ranges = {});

  // Sequential sharding of `mask` with the given heads and grid options.
  static Problem make(RangeMask mask, int cp_size, Heads heads, GridOptions grid = {});
  // The same for an index mask: token top-k as `index_mask`; block
  // selections converted to range masks (block_selection_masks): `mask` when
  // one is shared by all heads, else `head_masks`. Validates the mask (its
  // errors name the array and entry) and checks kv_heads is 1 or heads.kv.
  static Problem make(std::shared_ptr<const IndexMask> mask, int cp_size, Heads heads, GridOptions grid = {});
  // A token top-k problem from the ranks' gathered summaries and this rank's
  // own rows (the rows it summarised: one rank's shard of the sequential
  // layout). Checks the summary against the problem's blocks and heads, and
  // the own rows against their part of the summary (the same number of
  // selected pairs); errors name what differs. The rows' sorted copy takes
  // its store from `buffers` when given (a Session's, reused call after call).
  static Problem make(std::shared_ptr<const IndexSummary> summary, const TopkRows& own_rows, int cp_size, Heads heads,
                      GridOptions grid = {}, BufferRecycler* buffers = nullptr);
  // The same from this rank's row runs (summarize_topk_runs) instead of its
  // rows: the rank's plan leaves its index pool to the executor. Checks the
  // runs' cells against the summary's cells of the rank's query blocks.
  static Problem make(std::shared_ptr<const IndexSummary> summary, std::shared_ptr<const TopkRowRuns> own_runs,
                      int cp_size, Heads heads, GridOptions grid = {});
};

// Computed pairs of each query chunk [i c, min(S, (i + 1) c)) over every
// key, summed over the selection heads (one value per chunk): the load a
// dispatch of query chunks balances. Range masks: O(slices + chunks they
// touch); index masks: one pass over the indices.
std::vector<Token> query_chunk_areas(const Problem& p, Token chunk);

// The mask of head group `group` (KV head; 0 when all heads share one) as
// an S x S table, row-major, 1 = the pair is computed: the reference of
// brute-force checks and of the simulator's numeric mode, O(S^2).
std::vector<std::uint8_t> dense_mask(const Problem& p, int group);

}  // namespace cpsched
