// Kernel launch parameters: the tile work lists built from attention args,
// the grid shape and the head mapping of the attention kernels.
#include <doctest/doctest.h>

#include <map>
#include <random>

#include "cpsched/mask/mask.hpp"
#include "host/plan/worklist.hpp"
#include "host/programs/attention_programs.hpp"
#include "host/run/pipeline.hpp"

using namespace cpsched;
namespace g = cpsched::gpu;

namespace {

std::vector<AttnArg> random_args(std::mt19937_64& rng, int n, Token rows, Token cols) {
  const MaskType types[] = {MaskType::full, MaskType::causal, MaskType::inv_causal, MaskType::bi_causal};
  std::vector<AttnArg> args;
  for (int i = 0; i < n; ++i) {
    AttnArg a;
    a.q.begin = static_cast<Token>(rng() % static_cast<std::uint64_t>(rows - 1));
    a.q.end = a.q.begin + 1 + static_cast<Token>(rng() % static_cast<std::uint64_t>(std::min<Token>(150, rows - a.q.begin)));
    a.k.begin = static_cast<Token>(rng() % static_cast<std::uint64_t>(cols - 1));
    a.k.end = a.k.begin + 1 + static_cast<Token>(rng() % static_cast<std::uint64_t>(std::min<Token>(150, cols - a.k.begin)));
    a.type = types[rng() % 4];
    a.q_buf = rng() % 3 == 0 ? BufferId::remote : BufferId::local;
    a.k_buf = rng() % 3 == 0 ? BufferId::remote : BufferId::local;
    a.group = static_cast<int>(rng() % 3) - 1;
    args.push_back(a);
  }
  return args;
}

bool same_band(const g::Band2& a, const g::Band2& b) {
  return a.qa == b.qa && a.qb == b.qb && a.ka == b.ka && a.kb == b.kb && a.has_lo == b.has_lo &&
         a.has_hi == b.has_hi && (!a.has_lo || a.lo == b.lo) && (!a.has_hi || a.hi == b.hi);
}

}  // namespace

TEST_CASE("q-major work lists cover every unmasked entry of the args exactly once, with tight col loops") {
  std::mt19937_64 rng(31);
  for (int iter = 0; iter < 30; ++iter) {
    const auto args = random_args(rng, 1 + iter % 7, 400, 300);
    for (BufferId qb : {BufferId::local, BufferId::remote}) {
      const g::WorkList w = g::q_major(args, qb);
      REQUIRE(w.entry_begin.size() == w.tile_start.size() + 1);
      // entry hits per (arg, row, col)
      std::map<std::tuple<std::size_t, Token, Token>, int> hits;
      Token want_area = 0;
      for (std::size_t i = 0; i < args.size(); ++i) {
        if (args[i].q_buf != qb) continue;
        want_area += slice_area(Slice{args[i].q, args[i].k, args[i].type});
      }
      CHECK(w.area == want_area);
      for (int t = 0; t < w.num_tiles(); ++t) {
        const Token t0 = w.tile_start[static_cast<std::size_t>(t)];
        CHECK(t0 % g::kTile == 0);
        if (t > 0) CHECK(t0 > w.tile_start[static_cast<std::size_t>(t - 1)]);
        for (int e = w.entry_begin[static_cast<std::size_t>(t)]; e < w.entry_begin[static_cast<std::size_t>(t) + 1]; ++e) {
          const g::WorkEntry& we = w.entries[static_cast<std::size_t>(e)];
          CHECK(we.major_b >= t0);
          CHECK(we.major_e <= t0 + g::kTile);
          // Which arg: the one with this band (random args are distinct).
          std::size_t ai = args.size();
          for (std::size_t i = 0; i < args.size(); ++i)
            if (args[i].q_buf == qb && same_band(g::band_of(args[i]), we.band)) ai = i;
          REQUIRE(ai < args.size());
          CHECK(we.group == args[ai].group);
          CHECK(we.other_buf == (args[ai].k_buf == BufferId::local ? 0 : 1));
          Token lo = -1, hi = -1;
          for (Token row = we.major_b; row < we.major_e; ++row) {
            const g::Iv rc = g::row_cols(we.band, row);
            for (Token col = std::max(rc.b, we.loop_b); col < std::min(rc.e, we.loop_e); ++col) {
              ++hits[{ai, row, col}];
              lo = lo < 0 ? col : std::min(lo, col);
              hi = std::max(hi, col + 1);
            }
          }
          // Tight: the loop is exactly the cols the tile's rows need.
          CHECK(lo == we.loop_b);
          CHECK(hi == we.loop_e);
        }
      }
      Token covered = 0;
      for (const auto& [key, n] : hits) {
        CHECK(n == 1);
        const auto& [ai, row, col] = key;
        CHECK(slice_contains(Slice{args[ai].q, args[ai].k, args[ai].type}, row, col));
        ++covered;
      }
      CHECK(covered == want_area);
    }
  }
}

TEST_CASE("k-major work lists are the transpose: every entry once, tiles over cols, tight row loops") {
  std::mt19937_64 rng(32);
  for (int iter = 0; iter < 30; ++iter) {
    const auto args = random_args(rng, 1 + iter % 6, 300, 400);
    for (BufferId kb : {BufferId::local, BufferId::remote}) {
      const g::WorkList w = g::k_major(args, kb);
      Token want = 0, covered = 0;
      for (const AttnArg& a : args)
        if (a.k_buf == kb) want += slice_area(Slice{a.q, a.k, a.type});
      CHECK(w.area == want);
      for (int t = 0; t < w.num_tiles(); ++t) {
        const Token c0 = w.tile_start[static_cast<std::size_t>(t)];
        for (int e = w.entry_begin[static_cast<std::size_t>(t)]; e < w.entry_begin[static_cast<std::size_t>(t) + 1]; ++e) {
          const g::WorkEntry& we = w.entries[static_cast<std::size_t>(e)];
          CHECK(we.major_b >= c0);
          CHECK(we.major_e <= c0 + g::kTile);
          Token lo = -1, hi = -1;
          for (Token col = we.major_b; col < we.major_e; ++col) {
            const g::Iv cr = g::col_rows(we.band, col);
            for (Token row = std::max(cr.b, we.loop_b); row < std::min(cr.e, we.loop_e); ++row) {
              ++covered;
              lo = lo < 0 ? row : std::min(lo, row);
              hi = std::max(hi, row + 1);
            }
          }
          CHECK(lo == we.loop_b);
          CHECK(hi == we.loop_e);
        }
      }
      CHECK(covered == want);
    }
  }
}

TEST_CASE("grid: one CTA per touched tile and head slot") {
  std::vector<AttnArg> args{{{0, 10}, {0, 10}, MaskType::causal, BufferId::local, BufferId::local, -1},
                            {{130, 140}, {0, 5}, MaskType::full, BufferId::local, BufferId::remote, -1}};
  const g::WorkList w = g::q_major(args, BufferId::local);
  CHECK(w.tile_start == std::vector<g::i64>{0, 128});
  const g::Grid grid = g::grid_of(w, 8);
  CHECK(grid.x == 2);
  CHECK(grid.y == 8);
  CHECK(grid.threads == g::kTile);
  CHECK(g::grid_of(g::q_major(args, BufferId::remote), 8).x == 0);
}

TEST_CASE("head mapping: group filter on local buffers, group-local heads in remote ones, GQA") {
  // hq 8, hkv 4, 4 groups: a group is 2 q heads and 1 kv head.
  g::AttnLaunch p{};
  p.hq = 8;
  p.hkv = 4;
  p.groups = 4;
  g::WorkEntry w{};
  g::QHeads qh{};
  p.major_buf = 0;  // local q rows hold all 8 heads
  w.group = 2;
  w.other_buf = 0;
  REQUIRE(g::q_major_heads(p, w, 5, qh));
  CHECK(qh.q_buf_head == 5);
  CHECK(qh.k_buf_head == 2);
  w.other_buf = 1;  // remote kv rows hold group 2's one head
  REQUIRE(g::q_major_heads(p, w, 5, qh));
  CHECK(qh.k_buf_head == 0);
  w.group = 1;
  CHECK_FALSE(g::q_major_heads(p, w, 5, qh));
  p.major_buf = 1;  // remote q rows: slot = head inside the group
  w.group = 3;
  w.other_buf = 0;
  REQUIRE(g::q_major_heads(p, w, 1, qh));
  CHECK(qh.q_buf_head == 1);
  CHECK(qh.k_buf_head == 3);  // q head 7 reads kv head 3

  g::KHeads kh{};
  p.major_buf = 0;
  w.group = 3;
  w.other_buf = 0;
  REQUIRE(g::k_major_heads(p, w, 3, kh));
  CHECK(kh.q_first == 6);
  CHECK(kh.q_count == 2);
  w.other_buf = 1;
  REQUIRE(g::k_major_heads(p, w, 3, kh));
  CHECK(kh.q_first == 0);
  w.group = 0;
  CHECK_FALSE(g::k_major_heads(p, w, 3, kh));

  // Not flattened: one group holding every head.
  p.groups = 1;
  p.major_buf = 1;
  w.group = -1;
  w.other_buf = 1;
  REQUIRE(g::q_major_heads(p, w, 7, qh));
  CHECK(qh.k_buf_head == 3);
}

TEST_CASE("pass FLOPs: 4 x area x heads x D forward, 2.5 times that backward") {
  CalcMeta c;
  c.local_attn_args.push_back({{0, 10}, {0, 10}, MaskType::causal, BufferId::local, BufferId::local, 1});
  c.remote_attn_args.push_back({{{0, 4}, {0, 6}, MaskType::full, BufferId::remote, BufferId::local, -1}});
  Problem p;  // 8 query heads in 4 flattened groups, D = 16
  p.heads = Heads{8, 4, 16, 2};
  // causal 10x10: 55 entries x 2 heads (one group); full 4x6 = 24 x 8 heads.
  const double macs = 55.0 * 2 * 16 + 24.0 * 8 * 16;
  CHECK(g::pass_flops(c, p, g::Pass::fwd) == doctest::Approx(4 * macs));
  CHECK(g::pass_flops(c, p, g::Pass::bwd) == doctest::Approx(10 * macs));
}
