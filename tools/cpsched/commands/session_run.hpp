#pragma once
// Solving a config through the library facade (cpsched::Session), as the
// plan and run commands do: the config's mask is built with located errors,
// then solved, planned and measured by the host's solve path.
#include <memory>
#include <string>
#include <vector>

#include "cpsched/session/session.hpp"

namespace cpsched::cli {

struct SessionRun {
  std::shared_ptr<Registry> registry;
  std::unique_ptr<Session> session;
  const SolveResult& result() const { return session->result(); }
};

SessionRun solve_with_session(const Config& cfg, const std::vector<std::string>& extra_plugin_dirs);

}  // namespace cpsched::cli
