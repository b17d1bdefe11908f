// Solver plugin `owner`: every task runs on the host of its q block, so only
// KV moves. No balance target: the simplest reference placement.
#include <cpsched/plugin/plugin.hpp>
#include <cpsched/plugin/solver.hpp>

namespace {

class Owner final : public cpsched::Solver {
 public:
  explicit Owner(const cpsched::Params&) {}
  cpsched::Solution solve(const cpsched::SolveInput& in) override {
    const cpsched::TaskGrid& grid = *in.grid();
    cpsched::Solution sol;
    cpsched::Assignment& a = sol.assignment;
    a.grid = in.grid();
    a.rank.resize(static_cast<std::size_t>(grid.num_tasks()));
    for (cpsched::TaskId t = 0; t < grid.num_tasks(); ++t) {
      a.rank[static_cast<std::size_t>(t)] = grid.q_host(t);
    }
    return sol;
  }
};

}  // namespace

CPSCHED_SOLVER_PLUGIN_NOPARAMS(Owner, "owner",
                               "every task on its q block's host (KV-only communication)")
