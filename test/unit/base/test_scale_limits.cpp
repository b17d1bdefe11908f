// Hardening at scale: exact areas near the limits (128-bit reference), limit
// errors that name the key, the interval-sweep mask validation against brute
// force, the RangeSet bulk builder against add(), and resource estimates.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpsched/config/config.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/base/limits.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/plan/validator.hpp"
#include "cpsched/problem/resources.hpp"
#include "cpsched/problem/task_grid.hpp"
#include "test_helpers.hpp"

using namespace cpsched;
using test::error_of;

namespace {

// Row-by-row area in 128-bit inside qr x kr: the reference of slice_area far from 0.
__int128 rows_area(const Slice& s, Range qr, Range kr) {
  const Token lq = s.q.size(), lk = s.k.size(), d = lk - lq;
  __int128 a = 0;
  for (Token i = 0; i < lq; ++i) {
    if (!qr.contains(s.q.begin + i)) continue;
    Token lo = 0, hi = lk - 1;  // inclusive cols of row i, relative
    if (s.type == MaskType::causal || s.type == MaskType::bi_causal) hi = std::min(hi, i + d);
    if (s.type == MaskType::inv_causal || s.type == MaskType::bi_causal) lo = std::max(lo, i);
    lo = std::max(lo, kr.begin - s.k.begin);
    hi = std::min(hi, kr.end - 1 - s.k.begin);
    if (hi >= lo) a += hi - lo + 1;
  }
  return a;
}


struct Env {
  explicit Env(const char* value) { setenv("CPSCHED_MEMORY_BUDGET", value, 1); }
  ~Env() { unsetenv("CPSCHED_MEMORY_BUDGET"); }
};

const char* kQuick = R"(
problem:
  cp_size: 8
  seqlen_per_rank: 8192
  heads: {q: 64, kv: 8, dim: 128, dtype: bf16}
  grid: {flatten_head_groups: true, blocks_per_rank: 1}
  mask: {kind: causal}
)";

}  // namespace

TEST_CASE("slice areas far from 0 are exact against a 128-bit row-by-row reference") {
  std::mt19937_64 rng(7);
  const Token S = limits::kMaxSeqlen;
  for (int it = 0; it < 40; ++it) {
    const Token lq = 1 + static_cast<Token>(rng() % (1u << 18));
    const Token lk = 1 + static_cast<Token>(rng() % (1u << 18));
    const Token q0 = S - lq - static_cast<Token>(rng() % 1000), k0 = S - lk - static_cast<Token>(rng() % 1000);
    const Slice s{{q0, q0 + lq}, {k0, k0 + lk}, static_cast<MaskType>(it % 4)};
    CAPTURE(it);
    const __int128 ref = rows_area(s, s.q, s.k);
    CHECK(slice_area_wide(s, s.q, s.k) == ref);
    CHECK(slice_area(s) == static_cast<Token>(ref));
    // Clipped to a rectangle that cuts the slice.
    const Range qr{q0 + lq / 3, q0 + lq}, kr{k0, k0 + lk - lk / 4};
    CHECK(slice_area_wide(s, qr, kr) == rows_area(s, qr, kr));
  }
  // A full slice of 2^40 x 2^40 tokens: 2^80 entries, exact in 128-bit,
  // refused in 64-bit.
  const Slice big{{0, S}, {0, S}, MaskType::full};
  CHECK(slice_area_wide(big, big.q, big.k) == static_cast<__int128>(S) * S);
  CHECK_THROWS_AS(slice_area(big), Error);
  const Slice tri{{0, S}, {0, S}, MaskType::causal};
  CHECK(slice_area_wide(tri, tri.q, tri.k) == static_cast<__int128>(S) * (S + 1) / 2);
}

TEST_CASE("a load at the limit is exact in grid and metrics; one past it is a located error") {
  // Full mask with S = 2^28 and 64 q heads: total load = 2^56 x 2^6 = 2^62, the limit.
  const Token S = Token{1} << 28;
  const Heads h{64, 8, 128, 2};
  auto p = std::make_shared<const Problem>(Problem::make(RangeMask(S, {Slice{{0, S}, {0, S}, MaskType::full}}), 8, h));
  auto g = std::make_shared<const TaskGrid>(p);
  CHECK(g->total_area() == S * S);
  CHECK(g->total_load() == limits::kMaxLoad);
  CHECK(g->task_count() == 64 * 8);
  Assignment a{g, {}};
  for (TaskId t = 0; t < g->num_tasks(); ++t) a.rank.push_back(g->q_host(t));
  const Metrics m = compute_metrics(a);
  std::int64_t total = 0;
  for (std::int64_t l : m.load) total += l;
  CHECK(total == limits::kMaxLoad);
  CHECK(m.imbalance == doctest::Approx(1.0));
  CHECK(m.stage0_share == doctest::Approx(1.0 / 8));
  CHECK(m.fwd.total_send > 0);

  // One token more per rank is past the limit.
  const Token S2 = S + 8;
  const std::string e = error_of([&] {
    Problem::make(RangeMask(S2, {Slice{{0, S2}, {0, S2}, MaskType::full}}), 8, h);
  });
  CHECK(e.find("problem.mask: the total load (mask area x query heads)") != std::string::npos);
  CHECK(e.find("exceeds the limit 2^62") != std::string::npos);
}

TEST_CASE("limit errors name the key in the config") {
  Env budget("64G");
  // The issue's reproduction: S = 3.2e9, full mask.
  std::string e = error_of([] {
    parse_config(kQuick, "q.yaml", {"problem.seqlen_per_rank=400000000", "problem.mask={kind: full}"});
  });
  CHECK(e.find("problem.mask: the total load") != std::string::npos);
  // S beyond 2^40 (each value alone is accepted).
  e = error_of([] { parse_config(kQuick, "q.yaml", {"problem.cp_size=1048576", "problem.seqlen_per_rank=68719476736"}); });
  CHECK(e.find("problem.seqlen_per_rank: S (cp_size x seqlen_per_rank) = 72057594037927936 exceeds the limit 2^40") !=
        std::string::npos);
  e = error_of([] { parse_config(kQuick, "q.yaml", {"problem.heads.q=131072", "problem.heads.kv=8"}); });
  CHECK(e.find("problem.heads.q") != std::string::npos);
  CHECK(e.find("2^16") != std::string::npos);
  e = error_of([] { parse_config(kQuick, "q.yaml", {"problem.cp_size=4096", "problem.grid.blocks_per_rank=8192"}); });
  CHECK(e.find("problem.grid.blocks_per_rank") != std::string::npos);
  // Library users get the same key in the message.
  e = error_of([] { Sharding::sequential(Token{1} << 30, 1 << 20, 1 << 10); });
  CHECK(e.find("problem.grid.blocks_per_rank: blocks (cp_size x blocks_per_rank) = 1073741824 exceeds the limit 2^24") !=
        std::string::npos);
}

TEST_CASE("memory estimates stop a grid that would not fit, naming what to change") {
  SUBCASE("blocks_per_rank 8192 of the quickstart") {
    Env budget("2G");
    const std::string e = error_of([] { parse_config(kQuick, "q.yaml", {"problem.grid.blocks_per_rank=8192"}); });
    CHECK(e.find("problem.grid.blocks_per_rank: the estimated memory") != std::string::npos);
    CHECK(e.find("exceeds the memory budget 2.0 GiB (CPSCHED_MEMORY_BUDGET)") != std::string::npos);
    CHECK(e.find("lower problem.grid.blocks_per_rank (8192)") != std::string::npos);
  }
  SUBCASE("the grid constructor checks too") {
    Env budget("256M");
    const Token S = 1 << 16;
    auto p = std::make_shared<const Problem>(
        Problem::make(RangeMask(S, {Slice{{0, S}, {0, S}, MaskType::causal}}), 8, Heads{}, GridOptions{true, 2048}));
    CHECK_THROWS_AS(TaskGrid{p}, LimitError);
  }
  SUBCASE("the config's memory_budget key comes before the variable") {
    Env budget("64G");
    const std::string e = error_of(
        [] { parse_config(std::string(kQuick) + "memory_budget: 2G\n", "q.yaml", {"problem.grid.blocks_per_rank=8192"}); });
    CHECK(e.find("exceeds the memory budget 2.0 GiB (memory_budget in the config)") != std::string::npos);
    CHECK(parse_config(std::string(kQuick) + "memory_budget: 512M\n", "q.yaml").memory_budget == std::int64_t{512} << 20);
  }
  SUBCASE("the process's budget (set_memory_budget) comes before the variable") {
    Env budget("64G");
    set_memory_budget(std::int64_t{1} << 30, "test");
    CHECK(default_memory_budget().bytes == std::int64_t{1} << 30);
    CHECK(default_memory_budget().source == "test");
    set_memory_budget(0, "");
    CHECK(default_memory_budget().bytes == std::int64_t{64} << 30);
  }
  SUBCASE("a malformed budget is an error naming the variable") {
    Env budget("lots");
    CHECK(error_of([] { default_memory_budget(); }).find("CPSCHED_MEMORY_BUDGET: 'lots' is not a memory size") !=
          std::string::npos);
  }
  CHECK(parse_memory_size("16G") == std::int64_t{16} << 30);
  CHECK(parse_memory_size("512MiB") == std::int64_t{512} << 20);
  CHECK(parse_memory_size("1.5T") == std::int64_t{3} << 39);
  CHECK(parse_memory_size("4096") == 4096);
  CHECK_THROWS_AS(parse_memory_size("-1G"), Error);
  CHECK_THROWS_AS(parse_memory_size("12Q"), Error);
}

TEST_CASE("the cell estimate equals the grid's cells when no two slices share a cell, bounds it otherwise") {
  std::mt19937_64 rng(3);
  for (int it = 0; it < 30; ++it) {
    const Token S = 64 + static_cast<Token>(rng() % 200);
    std::vector<Slice> slices;
    // Documents (diagonal and full), one slice each: cells may be shared.
    for (Token b = 0; b < S;) {
      const Token len = std::min<Token>(S - b, 1 + static_cast<Token>(rng() % 40));
      slices.push_back({{b, b + len}, {b, b + len}, static_cast<MaskType>(rng() % 4)});
      b += len;
    }
    const int P = 1 + static_cast<int>(rng() % 8);
    const int c = 1 + static_cast<int>(rng() % 3);
    auto p = std::make_shared<const Problem>(Problem::make(RangeMask(S, slices), P, Heads{8, 2, 16, 2}, GridOptions{true, c}));
    const TaskGrid g(p);
    const ResourceEstimate e = estimate_resources(*p);
    std::int64_t pieces = 0;
    for (const Cell& cell : g.cells()) pieces += static_cast<std::int64_t>(cell.pieces.size());
    CHECK(e.touches >= pieces);
    CHECK(e.cells >= static_cast<std::int64_t>(g.cells().size()));
    CHECK(e.tasks == e.cells * 2);
    if (slices.size() == 1) CHECK(e.cells == static_cast<std::int64_t>(g.cells().size()));
  }
}

TEST_CASE("sweep validation agrees with brute force on random many-slice masks") {
  std::mt19937_64 rng(11);
  int overlapping = 0;
  for (int it = 0; it < 3000; ++it) {
    const Token S = 8 + static_cast<Token>(rng() % 24);
    std::vector<Slice> slices;
    const int n = 2 + static_cast<int>(rng() % 7);
    for (int i = 0; i < n; ++i) {
      const Token q0 = static_cast<Token>(rng() % S), k0 = static_cast<Token>(rng() % S);
      const Token q1 = std::min(S, q0 + 1 + static_cast<Token>(rng() % (S / 2)));
      const Token k1 = std::min(S, k0 + 1 + static_cast<Token>(rng() % (S / 2)));
      slices.push_back({{q0, q1}, {k0, k1}, static_cast<MaskType>(rng() % 4)});
    }
    // Brute force: the first pair (by slice order) sharing an entry.
    bool brute = false;
    for (Token q = 0; q < S && !brute; ++q)
      for (Token k = 0; k < S && !brute; ++k) {
        int hits = 0;
        for (const Slice& s : slices) hits += slice_contains(s, q, k) ? 1 : 0;
        brute = hits > 1;
      }
    const RangeMask m(S, slices);
    std::string err;
    try {
      m.validate();
    } catch (const Error& e) {
      err = e.what();
    }
    CAPTURE(it);
    REQUIRE(err.empty() == !brute);
    if (brute) {
      ++overlapping;
      // The named pair really overlaps.
      std::size_t a = 0, b = 0;
      REQUIRE(std::sscanf(err.c_str(), "mask slices %zu and %zu overlap", &a, &b) == 2);
      bool shared = false;
      for (Token q = 0; q < S && !shared; ++q)
        for (Token k = 0; k < S && !shared; ++k) shared = slice_contains(slices[a], q, k) && slice_contains(slices[b], q, k);
      CHECK(shared);
    }
  }
  CHECK(overlapping > 100);
  CHECK(overlapping < 2900);
}

TEST_CASE("sweep validation accepts disjoint diagonal bands and tilings") {
  // Many thin bands on the same rows: the sweep keeps them ordered.
  std::vector<Slice> bands;
  for (Token j = 0; j < 200; ++j) bands.push_back({{0, 1000}, {j, j + 1000}, MaskType::bi_causal});
  CHECK_NOTHROW(RangeMask(1200, bands).validate());
  // A square split into causal + the strict upper triangle, many times.
  std::vector<Slice> tiles;
  for (Token b = 0; b < 4000; b += 4) {
    tiles.push_back({{b, b + 4}, {b, b + 4}, MaskType::causal});
    tiles.push_back({{b, b + 3}, {b + 1, b + 4}, MaskType::inv_causal});
  }
  CHECK_NOTHROW(RangeMask(4000, tiles).validate());
  tiles.push_back({{3990, 3992}, {3991, 3992}, MaskType::full});
  CHECK(error_of([&] { RangeMask(4000, tiles).validate(); }).find("overlap") != std::string::npos);
  // Column stripes (the issue's slow case) and one stripe too many.
  std::vector<Slice> stripes;
  for (Token j = 0; j < 20000; ++j) stripes.push_back({{0, 20000}, {j, j + 1}, MaskType::full});
  CHECK_NOTHROW(RangeMask(20000, stripes).validate());
  stripes.push_back({{19999, 20000}, {5000, 5001}, MaskType::full});
  CHECK(error_of([&] { RangeMask(20000, stripes).validate(); }).find("mask slices 5000 and 20000 overlap") !=
        std::string::npos);
}

TEST_CASE("RangeSet::Builder equals add() one range at a time") {
  std::mt19937_64 rng(5);
  for (int it = 0; it < 500; ++it) {
    RangeSet one;
    RangeSet::Builder bulk;
    std::vector<Range> added;
    const int n = static_cast<int>(rng() % 60);
    const bool in_order = it % 3 == 0;
    Token next = 0;
    for (int i = 0; i < n; ++i) {
      Token b = in_order ? next + static_cast<Token>(rng() % 4) : static_cast<Token>(rng() % 200);
      const Token e = b + static_cast<Token>(rng() % 8);  // empty ranges too
      next = e;
      one.add({b, e});
      bulk.add(Range{b, e});
      added.push_back({b, e});
    }
    const RangeSet built = bulk.build();
    CHECK(built == one);
    CHECK(bulk.empty());
    // Sorted, disjoint, non-adjacent, non-empty.
    for (std::size_t i = 0; i < built.ranges().size(); ++i) {
      CHECK(!built.ranges()[i].empty());
      if (i > 0) CHECK(built.ranges()[i - 1].end < built.ranges()[i].begin);
    }
    // A token-by-token model of the ranges added.
    std::vector<bool> model(1024, false);
    for (Range r : added)
      for (Token t = r.begin; t < r.end; ++t) model[static_cast<std::size_t>(t)] = true;
    for (Token t = 0; t < 1024; ++t) CHECK(built.contains(t) == model[static_cast<std::size_t>(t)]);
  }
}

TEST_CASE("plans of one-token column stripes (thousands of ranges per transfer) are valid") {
  // Full-height stripes and block-high stripes, random placement, 1 and 3 stages:
  // the binary-searched buffer runs and the swept comm splits give a plan the
  // validator accepts (token-exact against the grid and the metrics).
  std::mt19937_64 rng(9);
  const int P = 8;
  const Token S = 2048;
  for (int variant = 0; variant < 2; ++variant) {
    std::vector<Slice> slices;
    for (Token j = 0; j < S; j += 2) {
      const Token q0 = variant == 0 ? 0 : (j / 2 % P) * (S / P);
      slices.push_back({{q0, variant == 0 ? S : q0 + S / P}, {j, j + 1}, MaskType::full});
    }
    auto p = std::make_shared<const Problem>(Problem::make(RangeMask(S, slices), P, Heads{8, 2, 16, 2}, GridOptions{true, 2}));
    auto g = std::make_shared<const TaskGrid>(p);
    Assignment a{g, {}};
    for (TaskId t = 0; t < g->num_tasks(); ++t) a.rank.push_back(static_cast<Rank>(rng() % P));
    for (int stages : {1, 3}) {
      const Plan plan = build_plan(a, stages);
      const std::vector<std::string> problems = validate_plan(a, plan);
      CAPTURE(variant);
      CAPTURE(stages);
      CHECK(problems.empty());
      if (!problems.empty()) MESSAGE(problems.front());
    }
  }
}

TEST_CASE("sweep validation against brute force on generator masks with one slice moved") {
  // Valid masks of many diagonal and full slices (windows, shared questions,
  // block-causal documents, prefix-LM), then one slice's edges moved by a
  // token or two: validate() throws exactly when some entry is covered twice.
  std::mt19937_64 rng(21);
  const std::vector<MaskKind> kinds{MaskKind::sliding_window, MaskKind::share_question,
                                    MaskKind::block_causal_document, MaskKind::prefix_lm,
                                    MaskKind::causal_document};
  int thrown = 0, accepted = 0;
  for (int it = 0; it < 400; ++it) {
    const Token S = 48 + static_cast<Token>(rng() % 48);
    MaskSpec spec;
    spec.kind = kinds[static_cast<std::size_t>(it) % kinds.size()];
    for (Token left = S; left > 0;) {
      const Token len = std::min<Token>(left, 4 + static_cast<Token>(rng() % 20));
      spec.lengths.push_back(len);
      left -= len;
    }
    spec.window_left = 1 + static_cast<Token>(rng() % 6);
    spec.window_right = static_cast<Token>(rng() % 4);
    spec.block_size = 2 + static_cast<Token>(rng() % 5);
    spec.num_answers = 1 + static_cast<int>(rng() % 3);
    std::vector<Slice> slices = make_mask(spec, S).slices();
    REQUIRE_NOTHROW(RangeMask(S, slices).validate());
    Slice& s = slices[static_cast<std::size_t>(rng() % slices.size())];
    Token* edge[] = {&s.q.begin, &s.q.end, &s.k.begin, &s.k.end};
    Token& e = *edge[rng() % 4];
    e = std::clamp<Token>(e + static_cast<Token>(rng() % 5) - 2, 0, S);
    if (s.q.empty() || s.k.empty()) continue;
    std::vector<int> cover(static_cast<std::size_t>(S * S), 0);
    bool twice = false;
    for (const Slice& x : slices)
      for (Token q = x.q.begin; q < x.q.end; ++q)
        for (Token k = x.k.begin; k < x.k.end; ++k)
          if (slice_contains(x, q, k)) twice |= ++cover[static_cast<std::size_t>(q * S + k)] > 1;
    bool threw = false;
    try {
      RangeMask(S, slices).validate();
    } catch (const Error&) {
      threw = true;
    }
    CAPTURE(it);
    CHECK(threw == twice);
    (threw ? thrown : accepted) += 1;
  }
  CHECK(thrown > 40);
  CHECK(accepted > 40);
}

TEST_CASE("a mask whose generation alone would not fit is refused before it is generated") {
  Env budget("64G");
  std::string e = error_of([] { parse_config(kQuick, "q.yaml", {"problem.mask={kind: causal_document, histogram: [[1, 1024, 10]], pack: 1000000000}"}); });
  CHECK(e.find("problem.mask.pack: reaching pack 1000000000 samples about") != std::string::npos);
  e = error_of([] {
    parse_config(kQuick, "q.yaml", {"problem.cp_size=65536", "problem.seqlen_per_rank=16777216",
                                    "problem.mask={kind: block_causal_document, block_size: 1}"});
  });
  CHECK(e.find("problem.mask: this mask would have about 1.1e+12 slices, over the limit 2^31 - 1") != std::string::npos);
  Env small("1M");
  e = error_of([] {
    parse_config(kQuick, "q.yaml", {"problem.mask={kind: block_causal_document, block_size: 4}"});
  });
  CHECK(e.find("problem.mask: generating this mask needs about") != std::string::npos);
  CHECK(e.find("over the memory budget 1.0 MiB (CPSCHED_MEMORY_BUDGET)") != std::string::npos);
}
