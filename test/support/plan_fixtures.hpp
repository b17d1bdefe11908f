#pragma once
// Small problems and assignments for the plan tests.
#include <memory>
#include <random>
#include <vector>

#include "cpsched/problem/assignment.hpp"
#include "cpsched/problem/problem.hpp"

namespace cpsched::test {

// The problem with layout planned (so that static may dispatch), shared.
inline std::shared_ptr<const Problem> planned(Problem p) {
  p.layout = Layout::planned;
  return std::make_shared<const Problem>(std::move(p));
}

// Layout planned by default: these grids serve every solver, static's
// dispatch included (problem.layout: fixed is tested on its own).
inline std::shared_ptr<const TaskGrid> make_grid(RangeMask mask, int cp_size, Heads heads = {4, 2, 8, 2},
                                                 GridOptions grid = {}, Layout layout = Layout::planned) {
  Problem p = Problem::make(std::move(mask), cp_size, heads, grid);
  p.layout = layout;
  return std::make_shared<const TaskGrid>(std::make_shared<const Problem>(std::move(p)));
}

// Every task on a rank drawn at random (the harshest placement for the builder:
// remote q and kv everywhere, several dsts per block).
inline Assignment random_assignment(std::shared_ptr<const TaskGrid> g, std::mt19937_64& rng) {
  Assignment a;
  a.grid = std::move(g);
  a.rank.resize(static_cast<std::size_t>(a.grid->num_tasks()));
  for (Rank& r : a.rank) r = static_cast<Rank>(rng() % static_cast<std::uint64_t>(a.grid->cp_size()));
  return a;
}

// Every task on the host of its q block (the `owner` solver, without plugins).
inline Assignment owner_assignment(std::shared_ptr<const TaskGrid> g) {
  Assignment a;
  a.grid = std::move(g);
  a.rank.resize(static_cast<std::size_t>(a.grid->num_tasks()));
  for (TaskId t = 0; t < a.grid->num_tasks(); ++t) a.rank[static_cast<std::size_t>(t)] = a.grid->q_host(t);
  return a;
}

}  // namespace cpsched::test
