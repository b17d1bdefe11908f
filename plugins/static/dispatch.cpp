#include "dispatch.hpp"

#include <algorithm>
#include <numeric>

#include <cpsched/hardware/kernel_model.hpp>
#include <cpsched/mask/slice_clip.hpp>

namespace cpsched::static_solver {

std::vector<Rank> deal_chunks(const std::vector<Token>& areas, int P) {
  const std::size_t n = areas.size();
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return areas[a] > areas[b]; });

  const std::size_t base = n / static_cast<std::size_t>(P);
  std::size_t extra_left = n % static_cast<std::size_t>(P);  // ranks that may still take base + 1
  std::vector<Token> load(static_cast<std::size_t>(P), 0);
  std::vector<std::size_t> count(static_cast<std::size_t>(P), 0);
  std::vector<Rank> host(n, 0);
  for (const std::size_t c : order) {
    Rank best = -1;
    for (Rank r = 0; r < P; ++r) {
      const std::size_t k = count[static_cast<std::size_t>(r)];
      const bool room = k < base || (k == base && extra_left > 0);
      if (room && (best < 0 || load[static_cast<std::size_t>(r)] < load[static_cast<std::size_t>(best)])) best = r;
    }
    if (count[static_cast<std::size_t>(best)] == base) --extra_left;
    ++count[static_cast<std::size_t>(best)];
    load[static_cast<std::size_t>(best)] += areas[c];
    host[c] = best;
  }
  return host;
}

std::vector<Range> uniform_chunks(Token S, Token chunk) {
  std::vector<Range> out;
  for (Token b = 0; b < S; b += chunk) out.push_back({b, std::min(b + chunk, S)});
  return out;
}

namespace {

// The chunks [first, last) that `q` overlaps (chunks in position order, contiguous).
std::pair<std::size_t, std::size_t> chunks_over(const std::vector<Range>& chunks, Range q) {
  const auto first = std::upper_bound(chunks.begin(), chunks.end(), q.begin,
                                      [](Token t, const Range& c) { return t < c.end; });
  const auto last = std::lower_bound(first, chunks.end(), q.end, [](const Range& c, Token t) { return c.begin < t; });
  return {static_cast<std::size_t>(first - chunks.begin()), static_cast<std::size_t>(last - chunks.begin())};
}

}  // namespace

std::vector<Range> chunk_key_ranges(const Problem& p, Token chunk) {
  return chunk_key_ranges(p, uniform_chunks(p.seqlen(), chunk));
}

std::vector<Range> chunk_key_ranges(const Problem& p, const std::vector<Range>& chunks) {
  std::vector<Range> keys(chunks.size(), Range{});
  if (p.index_mask || !p.head_masks.empty()) return keys;
  for (const Slice& s : p.mask.slices()) {
    if (s.q.empty() || s.k.empty()) continue;
    const auto [first, last] = chunks_over(chunks, s.q);
    for (std::size_t c = first; c < last; ++c) keys[c] = keys[c].hull(s.k);
  }
  return keys;
}

std::vector<Token> chunk_areas(const Problem& p, const std::vector<Range>& chunks) {
  std::vector<Token> area(chunks.size(), 0);
  const Range all{0, p.seqlen()};
  for (const Slice& s : p.mask.slices()) {
    const auto [first, last] = chunks_over(chunks, s.q);
    for (std::size_t c = first; c < last; ++c) area[c] += slice_area(s, chunks[c], all);
  }
  return area;
}

namespace {

// The bounds of the mask's ranges (its slices' q and k bounds, 0 and S),
// sorted: a cut between two of them is inside one range.
std::vector<Token> range_bounds(const Problem& p) {
  std::vector<Token> bounds{0, p.seqlen()};
  for (const Slice& s : p.mask.slices())
    for (Token t : {s.q.begin, s.q.end, s.k.begin, s.k.end}) bounds.push_back(t);
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  return bounds;
}

// Chunks that may move their cuts: range masks, every chunk at least two tiles.
bool movable(const Problem& p, const std::vector<Range>& chunks, Token tile) {
  if (tile < 2 || p.index_mask || !p.head_masks.empty()) return false;
  return std::all_of(chunks.begin(), chunks.end(), [&](const Range& c) { return c.size() >= 2 * tile; });
}

}  // namespace

std::vector<Range> tile_aligned_chunks(const Problem& p, std::vector<Range> chunks, Token tile) {
  if (!movable(p, chunks, tile)) return chunks;
  const std::vector<Token> bounds = range_bounds(p);
  for (std::size_t i = 0; i + 1 < chunks.size(); ++i) {
    const Token cut = chunks[i].end;
    const auto next = std::upper_bound(bounds.begin(), bounds.end(), cut);  // (S is in bounds: cut < S)
    const Token start = *(next - 1), end = *next;
    if (start == cut) continue;
    const Token moved = std::min(end, start + (cut - start + tile / 2) / tile * tile);
    chunks[i].end = chunks[i + 1].begin = moved;
  }
  return chunks;
}

std::vector<Range> tile_cuts_after_deal(const Problem& p, std::vector<Range> chunks, const std::vector<Rank>& host,
                                        Token tile) {
  if (!movable(p, chunks, tile)) return chunks;
  const std::vector<Token> bounds = range_bounds(p);
  for (std::size_t i = 0; i + 1 < chunks.size(); ++i) {
    if (host[i] == host[i + 1]) continue;  // one block: no cut
    const Token cut = chunks[i].end;
    const auto next = std::upper_bound(bounds.begin(), bounds.end(), cut);
    const Token start = *(next - 1), end = *next;
    const Token up = std::min(end, start + (cut - start + tile - 1) / tile * tile);
    chunks[i].end = chunks[i + 1].begin = up;
  }
  return chunks;
}

std::int64_t busiest_rank_tiles(const Problem& p, const std::vector<Range>& chunks, const std::vector<Rank>& host,
                                int P, Token tile) {
  const Sharding sh = dispatched_sharding(chunks, host, P);  // the plan's blocks, in position order
  const std::vector<Range>& blocks = sh.blocks;
  const std::vector<Rank>& owner = sh.host;
  std::vector<std::int64_t> load(static_cast<std::size_t>(P), 0);
  std::vector<Slice> tight;
  const int t = static_cast<int>(tile);
  for (const Slice& s : p.mask.slices()) {
    if (s.q.empty() || s.k.empty()) continue;
    const Band band = band_of(s);
    const auto [q0, q1] = chunks_over(blocks, s.q);
    for (std::size_t qi = q0; qi < q1; ++qi) {
      // The keys the band reaches from this block's rows: lo <= k - q <= hi.
      const Range rows = blocks[qi].intersect(s.q);
      const Range keys{std::max(s.k.begin, band.lo == Band::kNoLo ? s.k.begin : rows.begin + band.lo),
                       std::min(s.k.end, band.hi == Band::kNoHi ? s.k.end : rows.end - 1 + band.hi + 1)};
      if (keys.empty()) continue;
      const auto [k0, k1] = chunks_over(blocks, keys);
      for (std::size_t ki = k0; ki < k1; ++ki) {
        // A rectangle wholly inside the band (a full slice, or a causal one's
        // block below its diagonal): one full arg, no band to cut.
        const Range k = blocks[ki].intersect(s.k);
        if (k.end - 1 - rows.begin <= band.hi && k.begin - (rows.end - 1) >= band.lo) {
          load[static_cast<std::size_t>(owner[qi])] += tiles_touched(MaskType::full, rows.size(), k.size(), t, t);
          continue;
        }
        tight.clear();
        band_to_slices(clip(band, blocks[qi], blocks[ki]), tight);
        for (const Slice& x : tight)
          load[static_cast<std::size_t>(owner[qi])] += tiles_touched(x.type, x.q.size(), x.k.size(), t, t);
      }
    }
  }
  return load.empty() ? 0 : *std::max_element(load.begin(), load.end());
}

namespace {

// Tokens of `need` (key ranges, unsorted) outside `own` (chunk ranges): what a
// node must receive.
Token missing_tokens(std::vector<Range>& need, std::vector<Range>& own) {
  auto by_begin = [](const Range& x, const Range& y) { return x.begin < y.begin; };
  std::sort(need.begin(), need.end(), by_begin);
  std::sort(own.begin(), own.end(), by_begin);
  Token out = 0, cur_b = 0, cur_e = 0;
  std::size_t o = 0;
  auto flush = [&](Token b, Token e) {  // [b, e) minus own
    for (; o < own.size() && own[o].end <= b; ++o) {}
    Token pos = b;
    for (std::size_t i = o; i < own.size() && own[i].begin < e; ++i) {
      if (own[i].begin > pos) out += own[i].begin - pos;
      pos = std::max(pos, own[i].end);
    }
    if (pos < e) out += e - pos;
  };
  bool open = false;
  for (const Range& r : need) {
    if (r.empty()) continue;
    if (open && r.begin <= cur_e) {
      cur_e = std::max(cur_e, r.end);
      continue;
    }
    if (open) flush(cur_b, cur_e);
    cur_b = r.begin;
    cur_e = r.end;
    open = true;
  }
  if (open) flush(cur_b, cur_e);
  return out;
}

constexpr std::int64_t kSwapPairs = 1 << 20;  // swap pairs tried at most (a count: machine-independent)

}  // namespace

std::vector<Rank> deal_chunks_local(const std::vector<Token>& area, const std::vector<Range>& keys, Token size,
                                    int bins) {
  std::vector<Range> ranges(area.size());
  for (std::size_t c = 0; c < ranges.size(); ++c) ranges[c] = {static_cast<Token>(c) * size, static_cast<Token>(c + 1) * size};
  return deal_chunks_local(area, keys, ranges, bins);
}

std::vector<Rank> deal_chunks_local(const std::vector<Token>& area, const std::vector<Range>& keys,
                                    const std::vector<Range>& ranges, int bins) {
  const std::size_t m = area.size();
  // Start: the plain deal (largest first to the least loaded bin with room).
  std::vector<Rank> bin = deal_chunks(area, bins);
  std::vector<Token> load(static_cast<std::size_t>(bins), 0);
  for (std::size_t c = 0; c < m; ++c) load[static_cast<std::size_t>(bin[c])] += area[c];
  Token total = 0;
  for (Token x : area) total += x;
  // Swaps keep every load within the slack, or within the start's largest.
  const double bound = std::max(static_cast<double>(total) / bins * (1 + kNodeSlack),
                                static_cast<double>(*std::max_element(load.begin(), load.end())));
  auto fits = [&](Rank r, Token extra) { return static_cast<double>(load[static_cast<std::size_t>(r)] + extra) <= bound; };

  // Swap passes. cost(r): the keys bin r must receive, or its cut neighbours.
  const bool by_keys = std::any_of(keys.begin(), keys.end(), [](const Range& k) { return !k.empty(); });
  std::vector<std::vector<std::size_t>> in(static_cast<std::size_t>(bins));
  for (std::size_t c = 0; c < m; ++c) in[static_cast<std::size_t>(bin[c])].push_back(c);
  std::vector<Range> need, own;
  auto cost = [&](Rank r) -> double {
    const std::vector<std::size_t>& mine = in[static_cast<std::size_t>(r)];
    if (!by_keys) {
      Token cuts = 0;
      for (std::size_t c : mine)
        for (std::size_t d : {c - 1, c + 1})  // (c - 1 wraps past m at c = 0)
          if (d < m && bin[d] != r && area[c] > 0 && area[d] > 0) ++cuts;
      return static_cast<double>(cuts);
    }
    need.clear();
    own.clear();
    for (std::size_t c : mine) {
      need.push_back(keys[c]);
      own.push_back(ranges[c]);
    }
    return static_cast<double>(missing_tokens(need, own));
  };
  auto swap_in = [&](Rank r, std::size_t from, std::size_t to) {
    auto& v = in[static_cast<std::size_t>(r)];
    *std::find(v.begin(), v.end(), from) = to;
  };
  std::vector<double> cost_of(static_cast<std::size_t>(bins));
  for (Rank r = 0; r < bins; ++r) cost_of[static_cast<std::size_t>(r)] = cost(r);
  std::int64_t budget = kSwapPairs;
  for (int pass = 0; pass < 8 && budget > 0; ++pass) {
    bool improved = false;
    for (std::size_t x = 0; x < m && budget > 0; ++x)
      for (std::size_t y = x + 1; y < m; ++y) {
        const Rank a = bin[x], b = bin[y];
        if (a == b) continue;
        if (!fits(a, area[y] - area[x]) || !fits(b, area[x] - area[y])) continue;
        --budget;
        const double before = cost_of[static_cast<std::size_t>(a)] + cost_of[static_cast<std::size_t>(b)];
        bin[x] = b;
        bin[y] = a;
        swap_in(a, x, y);
        swap_in(b, y, x);
        const double ca = cost(a), cb = cost(b);
        if (ca + cb < before) {
          cost_of[static_cast<std::size_t>(a)] = ca;
          cost_of[static_cast<std::size_t>(b)] = cb;
          load[static_cast<std::size_t>(a)] += area[y] - area[x];
          load[static_cast<std::size_t>(b)] += area[x] - area[y];
          improved = true;
        } else {
          bin[x] = a;
          bin[y] = b;
          swap_in(a, y, x);
          swap_in(b, x, y);
        }
      }
    if (!improved) break;
  }
  return bin;
}

std::vector<Rank> deal_chunks_by_node(const std::vector<Token>& areas, const std::vector<Range>& keys, Token chunk,
                                      Token node_chunk, int P, int node_ranks) {
  std::vector<Range> chunks(areas.size());
  for (std::size_t i = 0; i < chunks.size(); ++i) chunks[i] = {static_cast<Token>(i) * chunk, static_cast<Token>(i + 1) * chunk};
  return deal_chunks_by_node(areas, keys, chunks, static_cast<std::size_t>(node_chunk / chunk), P, node_ranks);
}

std::vector<Rank> deal_chunks_by_node(const std::vector<Token>& areas, const std::vector<Range>& keys,
                                      const std::vector<Range>& chunks, std::size_t per, int P, int node_ranks) {
  const int nodes = P / node_ranks;
  const std::size_t n = areas.size();
  const std::size_t m = (n + per - 1) / per;
  std::vector<Token> node_area(m, 0);
  std::vector<Range> node_keys(m, Range{});
  // (A node chunk's tokens: its first chunk's start to where the next node chunk starts.)
  std::vector<Range> node_range(m, Range{});
  for (std::size_t j = 0; j < m; ++j)
    node_range[j] = {chunks[j * per].begin, j + 1 < m ? chunks[(j + 1) * per].begin : chunks[j * per].begin + Token(per) * (chunks[0].end - chunks[0].begin)};
  for (std::size_t i = 0; i < n; ++i) {
    node_area[i / per] += areas[i];
    if (i < keys.size()) node_keys[i / per] = node_keys[i / per].hull(keys[i]);
  }
  const std::vector<Rank> node_of = deal_chunks_local(node_area, node_keys, node_range, nodes);
  std::vector<Rank> host(n, 0);
  for (int node = 0; node < nodes; ++node) {
    std::vector<std::size_t> mine;
    for (std::size_t i = 0; i < n; ++i)
      if (node_of[i / per] == node) mine.push_back(i);
    std::vector<Token> a(mine.size());
    for (std::size_t k = 0; k < mine.size(); ++k) a[k] = areas[mine[k]];
    const std::vector<Rank> local = deal_chunks(a, std::min<int>(node_ranks, static_cast<int>(std::max<std::size_t>(mine.size(), 1))));
    for (std::size_t k = 0; k < mine.size(); ++k) host[mine[k]] = node * node_ranks + local[k];
  }
  return host;
}

Sharding dispatched_sharding(Token S, Token chunk, const std::vector<Rank>& host, int P) {
  return dispatched_sharding(uniform_chunks(S, chunk), host, P);
}

Sharding dispatched_sharding(const std::vector<Range>& chunks, const std::vector<Rank>& host, int P) {
  std::vector<Range> blocks;
  std::vector<Rank> owner;
  for (std::size_t i = 0; i < host.size(); ++i) {
    const Range r = chunks[i];
    if (!blocks.empty() && owner.back() == host[i]) {
      blocks.back().end = r.end;
    } else {
      blocks.push_back(r);
      owner.push_back(host[i]);
    }
  }
  return Sharding::dispatched(P, std::move(blocks), std::move(owner));
}

}  // namespace cpsched::static_solver
