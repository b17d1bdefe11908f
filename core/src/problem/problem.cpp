#include "cpsched/problem/problem.hpp"

#include "cpsched/problem/limits.hpp"

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

Sharding Sharding::of_host_ranges(Token seqlen, const std::vector<std::vector<Range>>& host_ranges) {
  const int P = static_cast<int>(host_ranges.size());
  if (P < 1) throw Error("host_ranges: no rank given");
  check_size_limits(seqlen, P, 1);
  std::vector<std::pair<Range, Rank>> all;
  for (int r = 0; r < P; ++r)
    for (std::size_t i = 0; i < host_ranges[static_cast<std::size_t>(r)].size(); ++i) {
      const Range x = host_ranges[static_cast<std::size_t>(r)][i];
      if (x.begin < 0 || x.end > seqlen || x.end <= x.begin)
        throw Error(fmt::format("host_ranges[{}][{}] = [{}, {}) is empty or outside [0, {})", r, i, x.begin, x.end,
                                seqlen));
      all.push_back({x, r});
    }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first.begin < b.first.begin; });
  Sharding s;
  s.cp_size = P;
  Token next = 0;
  for (const auto& [x, r] : all) {
    if (x.begin != next)
      throw Error(x.begin < next ? fmt::format("host_ranges: [{}, {}) of rank {} overlaps the tokens before {}",
                                               x.begin, x.end, r, next)
                                 : fmt::format("host_ranges: no rank holds the tokens [{}, {})", next, x.begin));
    if (!s.blocks.empty() && s.host.back() == r) s.blocks.back().end = x.end;  // one block per maximal range
    else s.blocks.push_back(x), s.host.push_back(r);
    next = x.end;
  }
  if (next != seqlen) throw Error(fmt::format("host_ranges: no rank holds the tokens [{}, {})", next, seqlen));
  return s;
}

bool Sharding::same_layout(const Sharding& o) const {
  if (cp_size != o.cp_size) return false;
  std::size_t i = 0, j = 0;
  Token at = 0;
  auto skip_empty = [](const Sharding& s, std::size_t& k) {
    while (k < s.blocks.size() && s.blocks[k].empty()) ++k;
  };
  while (true) {
    skip_empty(*this, i);
    skip_empty(o, j);
    if (i == blocks.size() || j == o.blocks.size()) break;
    if (host[i] != o.host[j]) return false;
    at = std::min(blocks[i].end, o.blocks[j].end);
    if (blocks[i].end == at) ++i;
    if (o.blocks[j].end == at) ++j;
  }
  return i == blocks.size() && j == o.blocks.size();
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
  if (!index_topk() && head_masks.empty() && mask.area_wide() == 0)
    throw Error(mask.slices().empty()
                    ? std::string("mask: no slice: the mask selects no (query, key) pair, nothing to plan")
                    : fmt::format("mask: its {} slice{} hold no unmasked (query, key) pair: nothing to plan",
                                  mask.slices().size(), mask.slices().size() == 1 ? "" : "s"));
}

void Problem::set_layout(Layout l, const std::vector<std::vector<Range>>& host_ranges) {
  layout = l;
  if (host_ranges.empty()) return;
  if (static_cast<int>(host_ranges.size()) != cp_size())
    throw Error(fmt::format("host_ranges: {} ranks' ranges for cp_size = {}", host_ranges.size(), cp_size()));
  if (grid.blocks_per_rank != 1)
    throw Error(fmt::format("host_ranges: the blocks follow the given ranges, so grid.blocks_per_rank must be 1, got {}",
                            grid.blocks_per_rank));
  sharding = Sharding::of_host_ranges(seqlen(), host_ranges);
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
