#include <doctest/doctest.h>

#include <random>

#include "brute_force.hpp"
#include "cpsched/problem/task_grid.hpp"

using namespace cpsched;

TEST_CASE("sequential sharding spreads the remainder over the first ranks") {
  const Sharding s = Sharding::sequential(10, 4, 1);
  CHECK(s.blocks == std::vector<Range>{{0, 3}, {3, 6}, {6, 8}, {8, 10}});
  const Sharding c = Sharding::sequential(10, 2, 3);
  CHECK(c.blocks == std::vector<Range>{{0, 2}, {2, 4}, {4, 5}, {5, 7}, {7, 9}, {9, 10}});
  CHECK(c.host == std::vector<Rank>{0, 0, 0, 1, 1, 1});
  CHECK(c.rank_tokens(1) == RangeSet{{5, 10}});
  CHECK(c.block_of(4) == 2);
  CHECK(c.block_of(10) == -1);
}

TEST_CASE("task grid cells equal brute force: area, needed rows and cols") {
  std::mt19937_64 rng(3);
  for (int iter = 0; iter < 60; ++iter) {
    const int P = 1 + static_cast<int>(rng() % 5);
    const int c = 1 + static_cast<int>(rng() % 3);
    const Token S = P * c * 5 + static_cast<Token>(rng() % 13);
    auto problem = std::make_shared<Problem>(
        Problem::make(test::random_document_mask(S, rng), P, Heads{8, 2, 16, 2}, GridOptions{iter % 2 == 0, c}));
    TaskGrid g(problem);
    CHECK(g.total_area() == problem->mask.area());
    CHECK(g.num_groups() == (iter % 2 == 0 ? 2 : 1));
    CHECK(g.num_tasks() == static_cast<TaskId>(g.cells().size()) * g.num_groups());
    const auto& blocks = g.sharding().blocks;
    std::size_t next = 0;
    for (int qb = 0; qb < g.sharding().num_blocks(); ++qb)
      for (int kb = 0; kb < g.sharding().num_blocks(); ++kb) {
        Token area = 0;
        std::vector<Range> rows, cols;
        for (Token q = blocks[qb].begin; q < blocks[qb].end; ++q)
          for (Token k = blocks[kb].begin; k < blocks[kb].end; ++k)
            if (test::mask_contains(problem->mask, q, k)) {
              ++area;
              rows.push_back({q, q + 1});
              cols.push_back({k, k + 1});
            }
        if (area == 0) continue;
        REQUIRE(next < g.cells().size());
        const Cell& cell = g.cells()[next++];
        CHECK(cell.qblock == qb);
        CHECK(cell.kblock == kb);
        CHECK(cell.area == area);
        CHECK(cell.rows == RangeSet(rows));
        CHECK(cell.cols == RangeSet(cols));
      }
    CHECK(next == g.cells().size());
  }
}
