#pragma once
// The portfolio's member solvers, made by name through the host's solver
// factory (SolveInput::solvers: the host's registry, so --plugin-path and
// plugin_paths reach them; a plugin does not link other plugins). A member
// may carry parameters: "static:chunk_tokens=2048+other=1". Each is made once,
// on first use, and kept (with its library) for the solver's lifetime.
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <cpsched/plugin/solver.hpp>

namespace cpsched::search {

class MemberSolvers {
 public:
  // The member's solution on `in`, or nullopt with `why` set when the host
  // offers no factory, the member is not installed or it fails on this input
  // (the portfolio goes on without it). Different members may solve at the
  // same time from several threads; one member solves one input at a time.
  std::optional<Solution> solve(const std::string& spec, const SolveInput& in, std::string& why);

 private:
  Solver* get(const std::string& spec, const SolveInput& in, std::string& why);
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Solver>> solvers_;
  std::map<std::string, std::string> missing_;
  std::map<std::string, std::mutex> busy_;  // per member, held while it solves
};

}  // namespace cpsched::search
