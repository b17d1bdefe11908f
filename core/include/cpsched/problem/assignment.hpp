#pragma once
// A placement: the rank that computes each task of a grid. What a solver
// chose (with its plan shape and figures) is a Solution (plugin/solver.hpp).
#include <memory>
#include <vector>

#include "cpsched/problem/task_grid.hpp"

namespace cpsched {

struct Assignment {
  // The grid the ranks refer to. A solver that re-dispatches tokens (static)
  // returns a grid over its own sharding; others return the input grid.
  std::shared_ptr<const TaskGrid> grid;
  std::vector<Rank> rank;  // rank[t] computes task t

  // Every task placed once on a rank in [0, P). Throws cpsched::Error.
  void validate() const;
};

}  // namespace cpsched
