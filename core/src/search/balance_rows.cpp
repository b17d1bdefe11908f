#include "cpsched/search/balance_rows.hpp"

#include <algorithm>
#include <functional>
#include <numeric>

#include "cpsched/search/rank_tree.hpp"

namespace cpsched::search {

void balance_rows(const TaskGrid& grid, std::vector<Rank>& rank, std::int64_t target) {
  const int P = grid.cp_size();
  const int G = grid.num_groups();
  const TaskId T = grid.num_tasks();
  const auto uP = static_cast<std::size_t>(P);
  std::vector<std::int64_t> load(uP, 0);
  if (grid.per_group_cells()) {
    for (TaskId t = 0; t < T; ++t) load[static_cast<std::size_t>(rank[static_cast<std::size_t>(t)])] += grid.load(t);
  } else {
    // Cell by cell: its groups' tasks share its load.
    const std::int64_t heads = grid.problem().q_heads_per_task();
    std::size_t t = 0;
    for (const Cell& c : grid.cells())
      for (int g = 0; g < G; ++g) load[static_cast<std::size_t>(rank[t++])] += c.area * heads;
  }
  std::vector<Rank> heavy;
  for (Rank r = 0; r < P; ++r)
    if (load[static_cast<std::size_t>(r)] > target) heavy.push_back(r);
  if (heavy.empty()) return;
  std::stable_sort(heavy.begin(), heavy.end(), [&](Rank a, Rank b) {
    return load[static_cast<std::size_t>(a)] > load[static_cast<std::size_t>(b)];
  });
  // Each heavy rank's tasks by (head group, task): a counting sort on rank x G + group.
  std::vector<char> is_heavy(uP, 0);
  for (Rank r : heavy) is_heavy[static_cast<std::size_t>(r)] = 1;
  const std::size_t keys = uP * static_cast<std::size_t>(G);
  std::vector<std::size_t> start(keys + 1, 0);
  auto key = [&](TaskId t) {
    return static_cast<std::size_t>(rank[static_cast<std::size_t>(t)]) * static_cast<std::size_t>(G) +
           static_cast<std::size_t>(t % G);
  };
  for (TaskId t = 0; t < T; ++t)
    if (is_heavy[static_cast<std::size_t>(rank[static_cast<std::size_t>(t)])] != 0) ++start[key(t) + 1];
  std::partial_sum(start.begin(), start.end(), start.begin());
  std::vector<TaskId> order(start.back());
  {
    std::vector<std::size_t> fill(start.begin(), start.end() - 1);
    for (TaskId t = 0; t < T; ++t)
      if (is_heavy[static_cast<std::size_t>(rank[static_cast<std::size_t>(t)])] != 0) order[fill[key(t)]++] = t;
  }
  RankTree<std::int64_t, std::less<>> least;
  least.reset(load);
  // Where each row's last moved task went (-1: none yet): q block x G + group.
  std::vector<Rank> row_to(static_cast<std::size_t>(grid.sharding().num_blocks()) * static_cast<std::size_t>(G), -1);
  auto move = [&](TaskId t, Rank a, Rank b, std::int64_t L) {
    rank[static_cast<std::size_t>(t)] = b;
    load[static_cast<std::size_t>(a)] -= L;
    load[static_cast<std::size_t>(b)] += L;
    least.set(a, load[static_cast<std::size_t>(a)]);
    least.set(b, load[static_cast<std::size_t>(b)]);
  };
  for (Rank a : heavy) {
    const std::size_t ua = static_cast<std::size_t>(a);
    for (std::size_t i = start[ua * static_cast<std::size_t>(G)];
         i < start[(ua + 1) * static_cast<std::size_t>(G)] && load[ua] > target; ++i) {
      const TaskId t = order[i];
      if (grid.q_host(t) == a && grid.k_host(t) == a) continue;
      const std::int64_t L = grid.load(t);
      Rank& to = row_to[static_cast<std::size_t>(grid.cell_of(t).qblock) * static_cast<std::size_t>(G) +
                        static_cast<std::size_t>(t % G)];
      Rank b = to;
      if (b < 0 || b == a || load[static_cast<std::size_t>(b)] + L > target) b = least.best();
      if (b == a || load[static_cast<std::size_t>(b)] + L > target) continue;
      move(t, a, b, L);
      to = b;
    }
  }
}

}  // namespace cpsched::search
