// Solver plugin `round_robin`: task t runs on rank (t + offset) mod P. Not a
// good schedule; an example of the plugin contract built out of tree.
#ifdef ROUND_ROBIN_OLD_INCLUDES
// The paths of cpsched 0.4, forwarding headers until 0.6 (the install test
// builds this file both ways).
#include <cpsched/plugin.hpp>
#include <cpsched/solver.hpp>
#else
#include <cpsched/plugin/plugin.hpp>
#include <cpsched/plugin/solver.hpp>
#endif

namespace {

class RoundRobin final : public cpsched::Solver {
 public:
  // Parameters arrive resolved: every declared one is set, with its type checked.
  explicit RoundRobin(const cpsched::Params& p) : offset_(p.get_int("offset")) {}

  cpsched::Solution solve(const cpsched::SolveInput& in) override {
    const cpsched::TaskGrid& grid = *in.grid();
    const std::int64_t P = grid.cp_size();
    cpsched::Solution sol;
    cpsched::Assignment& a = sol.assignment;
    a.grid = in.grid();
    a.rank.reserve(static_cast<std::size_t>(grid.num_tasks()));
    for (cpsched::TaskId t = 0; t < grid.num_tasks(); ++t) {
      a.rank.push_back(static_cast<cpsched::Rank>(((t + offset_) % P + P) % P));
    }
    return sol;
  }

 private:
  std::int64_t offset_;
};

const cpsched_param_spec kParams[] = {
    {"offset", CPSCHED_PARAM_INT, "0", "rank of task 0"},
};

}  // namespace

CPSCHED_SOLVER_PLUGIN(RoundRobin, "round_robin", "task t on rank (t + offset) mod P", kParams)
