// A solver whose constructor throws: the exception must stop at the plugin
// boundary and reach the host as a cpsched::Error.
#include <stdexcept>

#include <cpsched/plugin/plugin.hpp>
#include <cpsched/plugin/solver.hpp>

namespace {

class Refuses final : public cpsched::Solver {
 public:
  explicit Refuses(const cpsched::Params&) {
    throw std::runtime_error("refusing to start: test of the exception fence");
  }
  cpsched::Solution solve(const cpsched::SolveInput&) override { return {}; }
};

}  // namespace

CPSCHED_SOLVER_PLUGIN_NOPARAMS(Refuses, "throwing_factory", "its factory always throws")
