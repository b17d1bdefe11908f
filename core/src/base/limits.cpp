#include "cpsched/base/limits.hpp"

#include <fmt/format.h>

#include "cpsched/problem/metrics.hpp"
#include "cpsched/problem/problem.hpp"

namespace cpsched {

namespace {

std::string pow2(std::int64_t v) {
  for (int e = 0; e < 63; ++e)
    if (v == std::int64_t{1} << e) return fmt::format("2^{}", e);
  return fmt::format("{}", v);
}

std::string wide(__int128 v) {
  if (v <= std::numeric_limits<std::int64_t>::max()) return fmt::format("{}", static_cast<std::int64_t>(v));
  return fmt::format("{:.3g}", static_cast<double>(v));
}

void at_most(const char* key, const char* what, __int128 value, std::int64_t limit, const char* hint = "") {
  if (value > limit)
    throw LimitError(key, fmt::format("problem.{}: {} = {} exceeds the limit {}{}", key, what, wide(value),
                                      pow2(limit), hint));
}

}  // namespace

std::int64_t checked_int64(__int128 v, const char* what) {
  if (v > std::numeric_limits<std::int64_t>::max() || v < std::numeric_limits<std::int64_t>::min())
    throw Error(fmt::format("{}: {} does not fit in 64 bits (the problem is outside the limits of "
                            "cpsched/limits.hpp)",
                            what, wide(v)));
  return static_cast<std::int64_t>(v);
}

__int128 traffic_bound_bytes(const Problem& p) {
  // Both passes, both directions, all head groups: a rank can at most receive
  // every token of every group once per direction.
  const Heads& h = p.heads;
  const __int128 q = h.q_row_bytes(), o = h.o_row_bytes(), kv = h.kv_row_bytes();
  const __int128 hq = h.q, hkv = h.kv;
  const __int128 per_token = hq * (q + (o + 4) + (q + 2 * o + 4) + q) + hkv * kv * 3;
  return __int128{p.sharding.cp_size} * p.seqlen() * per_token;
}

void check_size_limits(Token seqlen, std::int64_t cp_size, std::int64_t blocks_per_rank) {
  using namespace limits;
  at_most("cp_size", "P", cp_size, kMaxRanks);
  at_most("seqlen_per_rank", "S (cp_size x seqlen_per_rank)", seqlen, kMaxSeqlen);
  at_most("grid.blocks_per_rank", "blocks_per_rank", blocks_per_rank, kMaxBlocksPerRank);
  at_most("grid.blocks_per_rank", "blocks (cp_size x blocks_per_rank)", __int128{cp_size} * blocks_per_rank,
          kMaxBlocks);
}

void check_shape_limits(const Problem& p) {
  using namespace limits;
  check_size_limits(p.seqlen(), p.sharding.cp_size, p.grid.blocks_per_rank);
  at_most("grid.blocks_per_rank", "blocks", static_cast<__int128>(p.sharding.blocks.size()), kMaxBlocks);
  at_most("heads.q", "query heads", p.heads.q, kMaxHeads);
  at_most("heads.kv", "key/value heads", p.heads.kv, kMaxHeads);
  at_most("heads.dim", "head dim D", p.heads.dim, kMaxHeadDim);
  at_most("heads.dim_v", "value head dim d_v", p.heads.dim_v, kMaxHeadDim);
  at_most("heads.dtype", "bytes per element", p.heads.dtype_bytes, kMaxDtypeBytes);
  at_most("mask", "slices", static_cast<__int128>(p.mask.slices().size()), kMaxSlices);
}

void check_load_limits(const Problem& p) {
  using namespace limits;
  // The mask is validated (inside [0, S)) before this, so each slice's area
  // is at most S^2 < 2^80 and the sum cannot overflow 128 bits.
  const __int128 load = p.mask.area_wide() * p.heads.q;
  at_most("mask", "the total load (mask area x query heads)", load, kMaxLoad,
          "; a sparser mask, fewer tokens (seqlen_per_rank) or fewer heads fit");
  at_most("cp_size", "the traffic bound (P x S x bytes per token of all heads)", traffic_bound_bytes(p),
          kMaxTrafficBytes, "; fewer ranks or tokens fit");
}

}  // namespace cpsched
