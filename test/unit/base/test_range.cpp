#include <doctest/doctest.h>

#include <random>
#include <set>

#include "cpsched/base/range.hpp"

using namespace cpsched;

TEST_CASE("RangeSet sorts, merges overlapping and adjacent ranges, drops empty ones") {
  RangeSet s{{10, 20}, {0, 5}, {5, 7}, {15, 25}, {30, 30}};
  CHECK(s.ranges() == std::vector<Range>{{0, 7}, {10, 25}});
  CHECK(s.size() == 22);
  CHECK(s.contains(6));
  CHECK_FALSE(s.contains(7));
  CHECK(s.contains(24));
  CHECK_FALSE(s.contains(25));
}

TEST_CASE("RangeSet set algebra matches a token-by-token model") {
  std::mt19937_64 rng(7);
  auto random_set = [&](std::set<Token>& model) {
    std::vector<Range> v;
    for (int i = 0; i < 6; ++i) {
      Token b = static_cast<Token>(rng() % 100), e = b + static_cast<Token>(rng() % 15);
      v.push_back({b, e});
      for (Token t = b; t < e; ++t) model.insert(t);
    }
    return RangeSet(v);
  };
  for (int iter = 0; iter < 200; ++iter) {
    std::set<Token> ma, mb;
    RangeSet a = random_set(ma), b = random_set(mb);
    std::set<Token> u = ma, in, diff;
    u.insert(mb.begin(), mb.end());
    for (Token t : ma) (mb.count(t) ? in : diff).insert(t);
    auto as_set = [](const RangeSet& s) {
      std::set<Token> out;
      for (Range r : s.ranges())
        for (Token t = r.begin; t < r.end; ++t) out.insert(t);
      return out;
    };
    CHECK(as_set(a.unite(b)) == u);
    CHECK(as_set(a.intersect(b)) == in);
    CHECK(as_set(a.subtract(b)) == diff);
    // Local offsets count the tokens of the set before t.
    Token off = 0;
    for (Token t : ma) CHECK(a.local_offset(t) == off++);
    CHECK(a.local_offset(1000) == -1);
    RangeSet incremental;
    for (Range r : a.ranges()) incremental.add(r);
    CHECK(incremental == a);
  }
}

TEST_CASE("to_local maps a global range to buffer pieces") {
  RangeSet s{{0, 10}, {20, 30}, {50, 60}};
  CHECK(s.to_local({5, 25}) == std::vector<Range>{{5, 10}, {10, 15}});
  CHECK(s.to_local({50, 60}) == std::vector<Range>{{20, 30}});
  CHECK(s.to_local({11, 19}).empty());
}

TEST_CASE("Range::hull covers both; an empty range adds nothing") {
  CHECK(Range{2, 5}.hull(Range{7, 9}) == Range{2, 9});
  CHECK(Range{7, 9}.hull(Range{2, 5}) == Range{2, 9});
  CHECK(Range{2, 5}.hull(Range{}) == Range{2, 5});
  CHECK(Range{}.hull(Range{3, 4}) == Range{3, 4});
  CHECK(Range{3, 3}.hull(Range{8, 9}) == Range{8, 9});  // empty, whatever its position
  CHECK(Range{}.hull(Range{}).empty());
}
