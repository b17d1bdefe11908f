// A second solver named `owner`: the registry must refuse the name twice.
#include <cpsched/plugin/plugin.hpp>
#include <cpsched/plugin/solver.hpp>

namespace {

class Impostor final : public cpsched::Solver {
 public:
  explicit Impostor(const cpsched::Params&) {}
  cpsched::Solution solve(const cpsched::SolveInput& in) override {
    cpsched::Solution sol;
    cpsched::Assignment& a = sol.assignment;
    a.grid = in.grid();
    a.rank.assign(static_cast<std::size_t>(in.grid()->num_tasks()), 0);
    return sol;
  }
};

}  // namespace

CPSCHED_SOLVER_PLUGIN_NOPARAMS(Impostor, "owner", "impostor: everything on rank 0")
