#pragma once
// What a solver returns: the rank that computes each task of a grid.
#include <memory>
#include <string>
#include <vector>

#include "cpsched/problem/task_grid.hpp"

namespace cpsched {

struct Assignment {
  // The grid the ranks refer to. A solver that re-dispatches tokens (static)
  // returns a grid over its own sharding; others return the input grid.
  std::shared_ptr<const TaskGrid> grid;
  std::vector<Rank> rank;        // rank[t] computes task t
  bool feasible = true;          // false: the balance target could not be met
  std::string note;              // solver's remark (why infeasible, iterations, ...)
  int stages = 0;                // remote stages the solver planned for (plan.stages: auto); 0: no choice made
  // Relays the solver planned for (plan.relay: auto): the ranks per node, or 0
  // for none; -1: no choice made (the host's setting applies).
  int relay_node_size = -1;

  // Every task placed once on a rank in [0, P). Throws cpsched::Error.
  void validate() const;
};

}  // namespace cpsched
