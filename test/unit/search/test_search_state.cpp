// libcpsched_search's placement state at scale: the (segment, rank, group)
// counts kept in a hash table when the dense table would be large give the
// same answers as the dense one, a State built on a large grid agrees with
// its incremental updates, and bulk moves with the slowest-rank list deferred
// (the unpriced repair) end where the same moves one by one do, and a repair
// with a limit on its priced evaluations stops there.
#include <doctest/doctest.h>

#include <limits>
#include <map>
#include <random>
#include <tuple>

#include "cpsched/search/byte_model.hpp"
#include "cpsched/search/placements.hpp"
#include "cpsched/search/search.hpp"
#include "cpsched/search/segment_counts.hpp"
#include "cpsched/search/state.hpp"
#include "random_specs.hpp"

using cpsched::search::SegmentCounts;

namespace {

void check_against_map(std::size_t segments, int groups, int ranks, std::size_t expected, bool want_dense) {
  SegmentCounts c;
  c.reset(segments, groups, ranks, expected);
  CHECK(c.dense() == want_dense);
  std::map<std::tuple<int, int, int>, int> ref;
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<std::int64_t> seg(0, static_cast<std::int64_t>(segments) - 1);
  std::uniform_int_distribution<int> grp(0, groups - 1), rk(0, ranks - 1);
  std::vector<std::tuple<int, int, int>> live;
  for (int step = 0; step < 200000; ++step) {
    // Mostly increments at fresh keys (the table grows past its expected
    // size), decrements of live keys, and re-increments of dropped ones.
    if (!live.empty() && rng() % 3 == 0) {
      const std::size_t i = rng() % live.size();
      auto [s, g, r] = live[i];
      const int before = ref[live[i]];
      REQUIRE(c.bump(s, g, r, -1) == before);
      if (--ref[live[i]] == 0) {
        live[i] = live.back();
        live.pop_back();
      }
    } else {
      const auto key = std::make_tuple(static_cast<int>(seg(rng)), grp(rng), rk(rng));
      const int before = ref[key];
      REQUIRE(c.bump(std::get<0>(key), std::get<1>(key), std::get<2>(key), +1) == before);
      if (before == 0) live.push_back(key);
      ++ref[key];
    }
  }
  for (const auto& [k, v] : ref) REQUIRE(c.get(std::get<0>(k), std::get<1>(k), std::get<2>(k)) == v);
  // Keys never touched read 0.
  for (int i = 0; i < 1000; ++i) {
    const auto key = std::make_tuple(static_cast<int>(seg(rng)), grp(rng), rk(rng));
    const auto it = ref.find(key);
    CHECK(c.get(std::get<0>(key), std::get<1>(key), std::get<2>(key)) == (it == ref.end() ? 0 : it->second));
  }
}

}  // namespace

TEST_CASE("segment counts: dense and hashed tables agree with a reference map") {
  check_against_map(1000, 4, 16, 100, true);            // 64k entries: dense
  check_against_map(200000, 8, 1024, 1000, false);      // 1.6G entries: hashed, grows from 1000
  check_against_map(3, 1, 2, 1, true);                  // tiny
}

TEST_CASE("segment counts: a hashed table's memory follows its entries, not the key space") {
  SegmentCounts c;
  c.reset(1'000'000, 8, 4096, 10000);  // 3.3e10 possible keys
  CHECK(!c.dense());
  for (int i = 0; i < 10000; ++i) c.bump(i * 97, i % 8, (i * 31) % 4096, +1);
  CHECK(c.memory_bytes() < 1'000'000);
}

#include <algorithm>
#include <functional>

#include "cpsched/search/rank_tree.hpp"

TEST_CASE("rank tree: best and top-k agree with a sort after random updates, ties to the lower rank") {
  using cpsched::search::RankTree;
  for (int P : {1, 2, 3, 7, 64, 1000}) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(P));
    std::vector<std::int64_t> v(static_cast<std::size_t>(P));
    for (auto& x : v) x = static_cast<std::int64_t>(rng() % 16);  // many ties
    RankTree<std::int64_t, std::greater<>> hi;
    RankTree<std::int64_t, std::less<>> lo;
    hi.reset(v);
    lo.reset(v);
    std::vector<int> got;
    for (int step = 0; step < 300; ++step) {
      const int r = static_cast<int>(rng() % static_cast<std::uint64_t>(P));
      v[static_cast<std::size_t>(r)] = static_cast<std::int64_t>(rng() % 16);
      hi.set(r, v[static_cast<std::size_t>(r)]);
      lo.set(r, v[static_cast<std::size_t>(r)]);
      std::vector<int> order(static_cast<std::size_t>(P));
      for (int i = 0; i < P; ++i) order[static_cast<std::size_t>(i)] = i;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return v[static_cast<std::size_t>(a)] > v[static_cast<std::size_t>(b)]; });
      const std::size_t k = std::min<std::size_t>(5, static_cast<std::size_t>(P));
      hi.top(k, got);
      REQUIRE(got == std::vector<int>(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k)));
      const auto mn = std::min_element(v.begin(), v.end()) - v.begin();  // first minimum: lowest rank
      REQUIRE(lo.best() == static_cast<int>(mn));
    }
  }
}

TEST_CASE("state: moves with the slowest-rank list deferred end where the same moves one by one do") {
  using namespace cpsched;
  std::mt19937_64 rng(11);
  for (MaskKind kind : {MaskKind::causal, MaskKind::full, MaskKind::causal_document}) {
    const auto grid = test::random_grid(kind, 24, Heads{16, 8, 64, 2}, rng);
    const search::ByteModel model(*grid, 1.0, 1.0);
    search::TimeObjective to;
    to.byte_s[0] = 1e-11;
    to.byte_s[1] = 1e-10;
    to.load_s = 1e-9;
    const TaskId T = grid->num_tasks();
    std::vector<Rank> start(static_cast<std::size_t>(T));
    for (auto& r : start) r = static_cast<Rank>(rng() % 24);
    const std::int64_t cap = std::numeric_limits<std::int64_t>::max() / 4;
    search::State one_by_one(model, start, cap, 0.0, &to), deferred(model, start, cap, 0.0, &to);
    deferred.defer_top(true);
    for (int i = 0; i < 400; ++i) {
      const auto t = static_cast<TaskId>(rng() % static_cast<std::uint64_t>(T));
      const auto b = static_cast<Rank>(rng() % 24);
      one_by_one.move(t, b);
      deferred.move(t, b);
      REQUIRE(deferred.least_loaded() == one_by_one.least_loaded());  // kept while deferred
    }
    deferred.defer_top(false);
    CHECK(deferred.max_rank_time() == one_by_one.max_rank_time());
    CHECK(deferred.objective() == one_by_one.objective());
    // And both agree with a state built on the final placement (up to the
    // rounding of incremental sums).
    const search::State fresh(model, one_by_one.placement(), cap, 0.0, &to);
    CHECK(one_by_one.max_rank_time() == doctest::Approx(fresh.max_rank_time()).epsilon(1e-9));
  }
}

TEST_CASE("repair_priced: stops at its limit with nothing moved unpriced, else meets the cap as repair does") {
  using namespace cpsched;
  std::mt19937_64 rng(21);
  const auto grid = test::random_grid(MaskKind::causal, 16, Heads{16, 8, 64, 2}, rng);
  const search::ByteModel model(*grid, 1.0, 1.0);
  search::TimeObjective to;
  to.byte_s[0] = 1e-11;
  to.byte_s[1] = 1e-10;
  to.load_s = 1e-9;
  const std::vector<Rank> owner = search::owner_placement(*grid);
  const std::int64_t cap = search::balance_cap(*grid, 1.1);
  search::State limited(model, owner, cap, 0.0, &to), full(model, owner, cap, 0.0, &to);
  REQUIRE(limited.excess() > 0);
  search::Budget b1{1000}, b2{1000};
  CHECK_FALSE(search::repair_priced(limited, b1, 3));
  CHECK(limited.excess() > 0);       // the rest was left, not moved unpriced
  CHECK(search::repair_priced(full, b2, std::int64_t{1} << 40));
  CHECK(full.excess() == 0);
}
