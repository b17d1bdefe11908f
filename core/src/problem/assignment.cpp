#include "cpsched/problem/assignment.hpp"

#include <fmt/format.h>

#include "cpsched/base/error.hpp"

namespace cpsched {

void Assignment::validate() const {
  if (!grid) throw Error("assignment: no grid");
  if (static_cast<std::int64_t>(rank.size()) != grid->task_count())
    throw Error(fmt::format("assignment: {} ranks for {} tasks", rank.size(), grid->num_tasks()));
  for (std::size_t t = 0; t < rank.size(); ++t)
    if (rank[t] < 0 || rank[t] >= grid->cp_size())
      throw Error(fmt::format("assignment: task {} is placed on rank {}, outside [0, {})", t, rank[t],
                              grid->cp_size()));
}

}  // namespace cpsched
