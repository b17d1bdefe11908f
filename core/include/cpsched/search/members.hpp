#pragma once
// The portfolio's member solvers, loaded by name through the plugin registry
// (a plugin does not link other plugins): `libcpsched_<name>.so` from the
// build's plugin folder and CPSCHED_PLUGIN_PATH. A member may carry
// parameters: "static:chunk_tokens=2048+other=1". Each member is loaded once,
// on first use, and kept (with its library) for the solver's lifetime.
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <cpsched/plugin/registry.hpp>
#include <cpsched/plugin/solver.hpp>

namespace cpsched::search {

class MemberSolvers {
 public:
  // The member's result on `in`, or nullopt with `why` set when the member is
  // not installed or fails on this input (the portfolio goes on without it).
  // Different members may solve at the same time from several threads; one
  // member solves one input at a time.
  std::optional<Assignment> solve(const std::string& name, const SolveInput& in, std::string& why);

 private:
  Solver* get(const std::string& name, std::string& why);
  std::mutex mutex_;
  std::unique_ptr<Registry> registry_;
  std::map<std::string, std::unique_ptr<Solver>> solvers_;
  std::map<std::string, std::string> missing_;
  std::map<std::string, std::mutex> busy_;  // per member, held while it solves
};

}  // namespace cpsched::search
