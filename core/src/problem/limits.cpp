#include "cpsched/problem/limits.hpp"

#include "cpsched/problem/problem.hpp"

namespace cpsched {

__int128 traffic_bound_bytes(const Problem& p) {
  // Both passes, both directions, all head groups: a rank can at most receive
  // every token of every group once per direction.
  const Heads& h = p.heads;
  const __int128 q = h.q_row_bytes(), o = h.o_row_bytes(), kv = h.kv_row_bytes();
  const __int128 hq = h.q, hkv = h.kv;
  const __int128 per_token = hq * (q + (o + 4) + (q + 2 * o + 4) + q) + hkv * kv * 3;
  return __int128{p.sharding.cp_size} * p.seqlen() * per_token;
}

void check_shape_limits(const Problem& p) {
  using namespace limits;
  check_size_limits(p.seqlen(), p.sharding.cp_size, p.grid.blocks_per_rank);
  check_at_most("grid.blocks_per_rank", "blocks", static_cast<__int128>(p.sharding.blocks.size()), kMaxBlocks);
  check_at_most("heads.q", "query heads", p.heads.q, kMaxHeads);
  check_at_most("heads.kv", "key/value heads", p.heads.kv, kMaxHeads);
  check_at_most("heads.dim", "head dim D", p.heads.dim, kMaxHeadDim);
  check_at_most("heads.dim_v", "value head dim d_v", p.heads.dim_v, kMaxHeadDim);
  check_at_most("heads.dtype", "bytes per element", p.heads.dtype_bytes, kMaxDtypeBytes);
  check_at_most("mask", "slices", static_cast<__int128>(p.mask.slices().size()), kMaxSlices);
}

void check_load_limits(const Problem& p) {
  using namespace limits;
  // The mask is validated (inside [0, S)) before this, so each slice's area
  // is at most S^2 < 2^80 and the sum cannot overflow 128 bits.
  const __int128 load = p.mask.area_wide() * p.heads.q;
  check_at_most("mask", "the total load (mask area x query heads)", load, kMaxLoad,
          "; a sparser mask, fewer tokens (seqlen_per_rank) or fewer heads fit");
  check_at_most("cp_size", "the traffic bound (P x S x bytes per token of all heads)", traffic_bound_bytes(p),
          kMaxTrafficBytes, "; fewer ranks or tokens fit");
}

}  // namespace cpsched
