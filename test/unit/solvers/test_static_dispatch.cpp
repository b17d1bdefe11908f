// The static solver's dispatch (plugins/static/dispatch.cpp, compiled in):
// dealing node chunks keeps counts equal and loads within the slack, and
// keeps documents together, so nodes receive fewer keys than with the plain
// largest-first deal.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <set>

#include "cpsched/hardware/kernel_model.hpp"
#include "cpsched/hardware/task_kernel.hpp"
#include "cpsched/problem/task_grid.hpp"
#include "dispatch.hpp"
#include "test_helpers.hpp"

using namespace cpsched;
using namespace cpsched::static_solver;

namespace {

// Keys the bins must receive: the union of their chunks' key ranges minus
// their own tokens, summed over bins (brute force, token by token).
Token missing(const std::vector<Rank>& bin, const std::vector<Range>& keys, Token size, int bins) {
  Token out = 0;
  for (Rank r = 0; r < bins; ++r) {
    std::set<Token> need, own;
    for (std::size_t c = 0; c < bin.size(); ++c)
      if (bin[c] == r) {
        for (Token t = keys[c].begin; t < keys[c].end; ++t) need.insert(t);
        for (Token t = static_cast<Token>(c) * size; t < static_cast<Token>(c + 1) * size; ++t) own.insert(t);
      }
    for (Token t : need) out += own.count(t) ? 0 : 1;
  }
  return out;
}

int adjacent_cuts(const std::vector<Rank>& bin, const std::vector<Token>& area) {
  int cuts = 0;
  for (std::size_t c = 0; c + 1 < bin.size(); ++c) cuts += bin[c] != bin[c + 1] && area[c] > 0 && area[c + 1] > 0;
  return cuts;
}

}  // namespace

TEST_CASE("deal_chunks_local: equal counts, loads within the slack, documents kept together") {
  // 32 chunks of 16 tokens on 4 bins: causal documents of 1 to 8 chunks.
  const Token size = 16;
  std::vector<Token> area;
  std::vector<Range> keys;
  Token start = 0;
  for (int len : {8, 1, 1, 3, 5, 1, 2, 6, 1, 4}) {
    for (int i = 0; i < len; ++i) {
      const Token c0 = start + i * size;
      area.push_back(size * (c0 - start) + size * (size + 1) / 2);  // causal rows of the chunk
      keys.push_back({start, c0 + size});
    }
    start += len * size;
  }
  REQUIRE(area.size() == 32);
  const int bins = 4;
  const std::vector<Rank> plain = deal_chunks(area, bins);
  const std::vector<Rank> local = deal_chunks_local(area, keys, size, bins);
  CHECK(local == deal_chunks_local(area, keys, size, bins));  // deterministic
  std::vector<int> count(bins, 0);
  std::vector<Token> load(bins, 0), plain_load(bins, 0);
  for (std::size_t c = 0; c < area.size(); ++c) {
    ++count[static_cast<std::size_t>(local[c])];
    load[static_cast<std::size_t>(local[c])] += area[c];
    plain_load[static_cast<std::size_t>(plain[c])] += area[c];
  }
  for (int n : count) CHECK(n == 8);
  const Token total = std::accumulate(area.begin(), area.end(), Token{0});
  const double bound = std::max(static_cast<double>(total) / bins * (1 + kNodeSlack),
                                static_cast<double>(*std::max_element(plain_load.begin(), plain_load.end())));
  for (Token l : load) CHECK(static_cast<double>(l) <= bound);
  const Token m_local = missing(local, keys, size, bins), m_plain = missing(plain, keys, size, bins);
  MESSAGE("keys to receive: ", m_local, " dealt locally, ", m_plain, " largest first");
  CHECK(m_local < m_plain);

  // Without keys (index masks): fewer neighbours on different bins.
  const std::vector<Rank> blind = deal_chunks_local(area, std::vector<Range>(area.size()), size, bins);
  CHECK(adjacent_cuts(blind, area) < adjacent_cuts(plain, area));
}

TEST_CASE("chunk_key_ranges: the hull of the keys each chunk's queries read") {
  // Two causal documents [0, 40) and [40, 64), chunks of 16 tokens.
  const RangeMask mask(64, {{{0, 40}, {0, 40}, MaskType::causal}, {{40, 64}, {40, 64}, MaskType::causal}});
  const Problem p = Problem::make(mask, 4, Heads{4, 2, 8, 2});
  const std::vector<Range> k = chunk_key_ranges(p, 16);
  REQUIRE(k.size() == 4);
  CHECK(k[0] == Range{0, 40});
  CHECK(k[1] == Range{0, 40});
  CHECK(k[2] == Range{0, 64});  // rows 32..47 read both documents' keys
  CHECK(k[3] == Range{40, 64});
}

TEST_CASE("tile_aligned_chunks: cuts inside a document at tile multiples from its start, each moved at most tile / 2") {
  // Causal documents of 300, 1000, 37, 1500 and 1259 tokens (S = 4096),
  // chunks of 512, tiles of 128.
  const std::vector<Token> docs{300, 1000, 37, 1500, 1259};
  std::vector<Slice> slices;
  std::vector<Token> starts{0};
  for (Token len : docs) {
    const Token b = starts.back();
    slices.push_back({{b, b + len}, {b, b + len}, MaskType::causal});
    starts.push_back(b + len);
  }
  const Token S = starts.back(), chunk = 512, tile = 128;
  const Problem p = Problem::make(RangeMask(S, slices), 4, Heads{4, 2, 8, 2});
  const std::vector<Range> uniform = uniform_chunks(S, chunk);
  // chunk_areas on uniform chunks is query_chunk_areas.
  CHECK(chunk_areas(p, uniform) == query_chunk_areas(p, chunk));
  const std::vector<Range> cut = tile_aligned_chunks(p, uniform, tile);
  REQUIRE(cut.size() == uniform.size());
  CHECK(cut.front().begin == 0);
  CHECK(cut.back().end == S);
  int moved = 0;
  for (std::size_t i = 0; i + 1 < cut.size(); ++i) {
    CAPTURE(i);
    CHECK(cut[i].end == cut[i + 1].begin);
    const Token c = cut[i].end;
    CHECK(std::abs(c - uniform[i].end) <= tile / 2);
    moved += c != uniform[i].end;
    // On a document's bound, or inside one at a multiple of the tile from its start.
    const auto doc = std::upper_bound(starts.begin(), starts.end(), c) - 1;
    CHECK((c == *doc || (c - *doc) % tile == 0));
  }
  CHECK(moved > 0);
  // The areas still add up to the mask's.
  const std::vector<Token> a = chunk_areas(p, cut);
  const std::vector<Token> before = query_chunk_areas(p, chunk);
  CHECK(std::accumulate(a.begin(), a.end(), Token{0}) == std::accumulate(before.begin(), before.end(), Token{0}));
  // Chunks shorter than two tiles: as given.
  CHECK(tile_aligned_chunks(p, uniform_chunks(S, 200), tile) == uniform_chunks(S, 200));
  CHECK(tile_aligned_chunks(p, uniform, 1) == uniform);
  // The dispatch over them: the chunks' tokens on their hosts, neighbours merged.
  const std::vector<Rank> host = deal_chunks(a, 4);
  const Sharding sh = dispatched_sharding(cut, host, 4);
  for (std::size_t i = 0; i < cut.size(); ++i)
    CHECK(sh.host[static_cast<std::size_t>(sh.block_of(cut[i].begin))] == host[i]);
  CHECK(dispatched_sharding(uniform, host, 4).blocks == dispatched_sharding(S, chunk, host, 4).blocks);
}

namespace {

// A random pack of causal and full documents over [0, S) (lengths up to 700
// tokens on even packs, 3000 on odd ones), its documents' starts (and S).
struct RandomPack {
  std::shared_ptr<const Problem> problem;
  std::vector<Token> starts;
};
RandomPack random_pack(int pack, Token S, int P, std::uint64_t& rng) {
  auto next = [&](Token n) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<Token>((rng >> 33) % static_cast<std::uint64_t>(n));
  };
  std::vector<Slice> slices;
  std::vector<Token> starts{0};
  while (starts.back() < S) {
    const Token b = starts.back(), len = std::min(S - b, 1 + next(pack % 2 ? 3000 : 700));
    slices.push_back({{b, b + len}, {b, b + len}, next(2) ? MaskType::causal : MaskType::full});
    starts.push_back(b + len);
  }
  return {std::make_shared<const Problem>(Problem::make(RangeMask(S, slices), P, Heads{4, 2, 8, 2})), starts};
}

// Tiles the plan's args touch in both passes (task_kernel_args: the args the
// plan builder makes of each task; 128 x 128 forward, 64 x 128 backward).
std::int64_t plan_tiles(const std::shared_ptr<const Problem>& p, const std::vector<Range>& chunks,
                        const std::vector<Rank>& host, int P) {
  const TaskGrid g(p, dispatched_sharding(chunks, host, P));
  const auto on_host = [&](TaskId t) { return g.q_host(t); };
  std::int64_t tiles = 0;
  for (const auto& [tq, tk] : {std::pair{128, 128}, std::pair{64, 128}})
    for (const std::int64_t n : test::rank_tiles(g, on_host, tq, tk)) tiles += n;
  return tiles;
}

}  // namespace

TEST_CASE("tile_cuts_after_deal: the deal kept, each cut between two ranks moved up to a tile, fewer tiles in all") {
  // Random packs of causal and full documents (S = 16384, 4 ranks, chunks of
  // 512, tiles of 128), dealt by area as published.
  const Token S = 16384, chunk = 512, tile = 128;
  const int P = 4;
  std::uint64_t rng = 12345;
  int moved = 0;
  for (int pack = 0; pack < 8; ++pack) {
    const auto [p, starts] = random_pack(pack, S, P, rng);
    const std::vector<Range> uniform = uniform_chunks(S, chunk);
    const std::vector<Rank> host = deal_chunks(query_chunk_areas(*p, chunk), P);
    const std::vector<Range> cut = tile_cuts_after_deal(*p, uniform, host, tile);
    REQUIRE(cut.size() == uniform.size());
    CHECK(cut.front().begin == 0);
    CHECK(cut.back().end == S);
    for (std::size_t i = 0; i + 1 < cut.size(); ++i) {
      CAPTURE(pack);
      CAPTURE(i);
      CHECK(cut[i].end == cut[i + 1].begin);
      const Token c = cut[i].end, was = uniform[i].end;
      if (host[i] == host[i + 1]) {  // one block: left where it was
        CHECK(c == was);
        continue;
      }
      CHECK(c >= was);
      CHECK(c - was < tile);
      moved += c != was;
      // At a document's bound, or inside one at a multiple of the tile from its start.
      const auto doc = std::upper_bound(starts.begin(), starts.end(), was) - 1;
      CHECK((c == *doc || c == *(doc + 1) || (c - *doc) % tile == 0));
    }
    // The same deal with its cuts at tiles: its documents' pieces touch no
    // more tiles in all (every piece of a document but its last a whole
    // number of tiles, on both sides of each arg).
    CHECK(plan_tiles(p, cut, host, P) <= plan_tiles(p, uniform, host, P));
  }
  CHECK(moved > 0);
  // Chunks shorter than two tiles, or no tile: as given.
  const std::vector<Slice> two{{{0, 1000}, {0, 1000}, MaskType::causal},
                               {{1000, 4096}, {1000, 4096}, MaskType::causal}};
  const Problem p = Problem::make(RangeMask(4096, two), 4, Heads{4, 2, 8, 2});
  std::vector<Rank> round(21);
  for (std::size_t c = 0; c < round.size(); ++c) round[c] = static_cast<Rank>(c % 4);
  CHECK(tile_cuts_after_deal(p, uniform_chunks(4096, 200), round, tile) == uniform_chunks(4096, 200));
  CHECK(tile_cuts_after_deal(p, uniform_chunks(4096, 512), {0, 1, 2, 3, 0, 1, 2, 3}, 1) ==
        uniform_chunks(4096, 512));
}

TEST_CASE("busiest_rank_tiles: the most tiles one rank's args touch, as the plan's own args count them") {
  // Random packs (S = 16384, 4 ranks, chunks of 512) dealt as published, cut
  // at tiles before and after the deal: against a count over the dispatched
  // grid's tasks (task_kernel_args, each task on its q block's host).
  const Token S = 16384, chunk = 512;
  const int P = 4;
  std::uint64_t rng = 777;
  for (int pack = 0; pack < 8; ++pack) {
    const auto [p, starts] = random_pack(pack, S, P, rng);
    const std::vector<Range> uniform = uniform_chunks(S, chunk);
    const std::vector<Rank> host = deal_chunks(query_chunk_areas(*p, chunk), P);
    const std::vector<Range> aligned = tile_aligned_chunks(*p, uniform, 128);
    const std::vector<Rank> aligned_host = deal_chunks(chunk_areas(*p, aligned), P);
    const std::vector<Range> after = tile_cuts_after_deal(*p, uniform, host, 128);
    for (const Token tile : {Token{64}, Token{128}, Token{256}})
      for (const auto& [chunks, h] : {std::pair{uniform, host}, std::pair{aligned, aligned_host}, std::pair{after, host}}) {
        const TaskGrid g(p, dispatched_sharding(chunks, h, P));
        const std::vector<std::int64_t> load =
            test::rank_tiles(g, [&](TaskId t) { return g.q_host(t); }, static_cast<int>(tile), static_cast<int>(tile));
        // The grid's tasks are per head group (flattened: 2 groups of the same args).
        const std::int64_t groups = g.num_groups();
        CAPTURE(pack);
        CAPTURE(tile);
        CHECK(busiest_rank_tiles(*p, chunks, h, P, tile) * groups == *std::max_element(load.begin(), load.end()));
      }
  }
}
