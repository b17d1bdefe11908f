#include "commands/session_run.hpp"

#include "commands/plugin_folders.hpp"

namespace cpsched::cli {

SessionRun solve_with_session(const Config& cfg, const std::vector<std::string>& extra_plugin_dirs) {
  SessionRun r;
  r.registry = std::make_shared<Registry>();
  scan_plugins(*r.registry, &cfg, extra_plugin_dirs);
  r.session = std::make_unique<Session>(cfg, r.registry);
  r.session->solve_config_mask();
  return r;
}

}  // namespace cpsched::cli
