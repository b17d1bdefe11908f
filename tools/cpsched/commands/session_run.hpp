#pragma once
// Solving a config through the library facade (cpsched::Session), as the
// plan and run commands do: the config's mask is built with located errors,
// then solved, planned and measured.
#include <memory>

#include "cpsched/session/session.hpp"
#include "commands/plugin_folders.hpp"

namespace cpsched::cli {

struct SessionRun {
  std::shared_ptr<Registry> registry;
  std::unique_ptr<Session> session;
  Solved solved;          // the figures the report prints
  double plan_ms = 0;
};

SessionRun solve_with_session(const Config& cfg, const std::vector<std::string>& extra_plugin_dirs);

}  // namespace cpsched::cli
