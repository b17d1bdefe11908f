#pragma once
// A problem: the mask, how tokens are sharded over P ranks, the attention heads
// and the grid options (DESIGN §1, §3).
#include <cstdint>
#include <vector>

#include <memory>

#include "cpsched/index_mask.hpp"
#include "cpsched/mask.hpp"
#include "cpsched/range.hpp"

namespace cpsched {

using Rank = std::int32_t;

struct Heads {
  int q = 64;          // hq
  int kv = 8;          // hkv
  int dim = 128;       // D
  int dtype_bytes = 2; // b (bf16)
};

struct GridOptions {
  bool flatten_head_groups = true;
  int blocks_per_rank = 1;
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

  int num_blocks() const { return static_cast<int>(blocks.size()); }
  RangeSet rank_tokens(Rank r) const;       // what rank r hosts, global coords
  std::vector<RangeSet> all_rank_tokens() const;
  int block_of(Token t) const;              // binary search; -1 if outside
  void validate(Token seqlen) const;        // tiles [0, S) in order, hosts in range
};

struct Problem {
  // The mask: range slices, or (index masks, index_mask.hpp) `mask` holds
  // only S and one of the two below says which pairs are selected.
  RangeMask mask;
  // Token top-k selections (kind topk): cells from count_index_cells, plan
  // args as index args (plan.hpp).
  std::shared_ptr<const IndexMask> index_mask;
  // Per KV head range masks (block selections of several heads, converted by
  // block_selection_masks): head group g of a flattened grid uses
  // head_masks[g]; empty: `mask` for every head.
  std::vector<RangeMask> head_masks;
  Heads heads;
  GridOptions grid;
  Sharding sharding;

  int cp_size() const { return sharding.cp_size; }
  Token seqlen() const { return mask.seqlen(); }
  // Head groups scheduled independently: hkv when flattened, else 1.
  int num_groups() const { return grid.flatten_head_groups ? heads.kv : 1; }
  int q_heads_per_task() const { return heads.q / num_groups(); }
  int kv_heads_per_task() const { return heads.kv / num_groups(); }

  // Checks P >= 1, heads divide, D, b > 0, the mask and the sharding.
  // Throws cpsched::Error naming the offending value.
  void validate() const;

  // Sequential sharding of `mask` with the given heads and grid options.
  static Problem make(RangeMask mask, int cp_size, Heads heads, GridOptions grid = {});
};

}  // namespace cpsched
