#include "cpsched/problem/problem.hpp"

#include <algorithm>
#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "cpsched/base/limits.hpp"

namespace cpsched {

namespace {
// Piece p of n near-equal pieces of [begin, begin+len): the first len mod n get one more.
Range even_piece(Token begin, Token len, Token n, Token p) {
  const Token base = len / n, extra = len % n;
  const Token start = begin + p * base + std::min(p, extra);
  return {start, start + base + (p < extra ? 1 : 0)};
}
}  // namespace

Sharding Sharding::sequential(Token seqlen, int cp_size, int blocks_per_rank) {
  if (cp_size < 1) throw Error(fmt::format("cp_size must be at least 1, got {}", cp_size));
  if (blocks_per_rank < 1)
    throw Error(fmt::format("blocks_per_rank must be at least 1, got {}", blocks_per_rank));
  check_size_limits(seqlen, cp_size, blocks_per_rank);  // before P x c blocks are allocated
  Sharding s;
  s.cp_size = cp_size;
  s.blocks.reserve(static_cast<std::size_t>(cp_size) * static_cast<std::size_t>(blocks_per_rank));
  for (int p = 0; p < cp_size; ++p) {
    const Range shard = even_piece(0, seqlen, cp_size, p);
    for (int b = 0; b < blocks_per_rank; ++b) {
      s.blocks.push_back(even_piece(shard.begin, shard.size(), blocks_per_rank, b));
      s.host.push_back(p);
    }
  }
  return s;
}

Sharding Sharding::dispatched(int cp_size, std::vector<Range> blocks, std::vector<Rank> host) {
  Sharding s;
  s.cp_size = cp_size;
  s.blocks = std::move(blocks);
  s.host = std::move(host);
  return s;
}

RangeSet Sharding::rank_tokens(Rank r) const {
  std::vector<Range> v;
  for (std::size_t b = 0; b < blocks.size(); ++b)
    if (host[b] == r) v.push_back(blocks[b]);
  return RangeSet(std::move(v));
}

std::vector<RangeSet> Sharding::all_rank_tokens() const {
  std::vector<std::vector<Range>> v(static_cast<std::size_t>(cp_size));
  for (std::size_t b = 0; b < blocks.size(); ++b) v[static_cast<std::size_t>(host[b])].push_back(blocks[b]);
  std::vector<RangeSet> out;
  out.reserve(v.size());
  for (auto& x : v) out.emplace_back(std::move(x));
  return out;
}

int Sharding::block_of(Token t) const {
  auto it = std::upper_bound(blocks.begin(), blocks.end(), t, [](Token v, Range r) { return v < r.end; });
  if (it == blocks.end() || !it->contains(t)) return -1;
  return static_cast<int>(it - blocks.begin());
}

void Sharding::validate(Token seqlen) const {
  if (cp_size < 1) throw Error(fmt::format("cp_size must be at least 1, got {}", cp_size));
  if (blocks.size() != host.size())
    throw Error(fmt::format("sharding: {} blocks but {} hosts", blocks.size(), host.size()));
  Token next = 0;
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    if (blocks[b].begin != next || blocks[b].end < blocks[b].begin)
      throw Error(fmt::format("sharding: block {} is [{}, {}) but should start at {}", b, blocks[b].begin,
                              blocks[b].end, next));
    if (host[b] < 0 || host[b] >= cp_size)
      throw Error(fmt::format("sharding: block {} is hosted by rank {}, outside [0, {})", b, host[b], cp_size));
    next = blocks[b].end;
  }
  if (next != seqlen)
    throw Error(fmt::format("sharding: blocks cover [0, {}) but the sequence has {} tokens", next, seqlen));
}

void Problem::validate() const {
  if (sharding.cp_size < 1) throw Error(fmt::format("cp_size must be at least 1, got {}", sharding.cp_size));
  if (heads.q < 1 || heads.kv < 1)
    throw Error(fmt::format("heads: q ({}) and kv ({}) must be at least 1", heads.q, heads.kv));
  if (heads.q % heads.kv != 0)
    throw Error(fmt::format("heads: q heads ({}) must be a multiple of kv heads ({})", heads.q, heads.kv));
  if (heads.dim < 1) throw Error(fmt::format("heads: dim must be at least 1, got {}", heads.dim));
  if (heads.dtype_bytes < 1)
    throw Error(fmt::format("heads: dtype bytes must be at least 1, got {}", heads.dtype_bytes));
  if (heads.dim_v < 0)
    throw Error(fmt::format("heads: dim_v must be at least 0 (0: same as dim), got {}", heads.dim_v));
  if (heads.kv_shared && heads.dv() > heads.dim)
    throw Error(fmt::format("heads: kv_shared needs dim_v <= dim (V is the first dim_v dims of the latent K row), "
                            "got dim_v {} > dim {}",
                            heads.dv(), heads.dim));
  if (grid.blocks_per_rank < 1)
    throw Error(fmt::format("grid: blocks_per_rank must be at least 1, got {}", grid.blocks_per_rank));
  check_shape_limits(*this);
  mask.validate();
  check_load_limits(*this);  // needs the slices inside [0, S)
  sharding.validate(mask.seqlen());
  // An empty workload is an error wherever it comes from (YAML, .npy, C++,
  // Python): a plan of 0 tasks that "passes" hides the mistake. Index masks
  // are checked when made (Problem::make), where their area is counted once.
  if (!index_mask && head_masks.empty() && mask.area_wide() == 0)
    throw Error(mask.slices().empty()
                    ? std::string("mask: no slice: the mask selects no (query, key) pair, nothing to plan")
                    : fmt::format("mask: its {} slice{} hold no unmasked (query, key) pair: nothing to plan",
                                  mask.slices().size(), mask.slices().size() == 1 ? "" : "s"));
}

Problem Problem::make(RangeMask mask, int cp_size, Heads heads, GridOptions grid) {
  Problem p;
  p.heads = heads;
  p.grid = grid;
  p.sharding = Sharding::sequential(mask.seqlen(), cp_size, grid.blocks_per_rank);
  p.mask = std::move(mask);
  p.validate();
  return p;
}

}  // namespace cpsched
