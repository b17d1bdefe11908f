#pragma once
// What the commands share: where plugins are found, and the figures of a
// solved config that the reports print.
#include <memory>
#include <string>
#include <vector>

#include "cpsched/config/config.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/plugin/registry.hpp"

namespace cpsched::cli {

// Plugin folders: the build's/installation's, CPSCHED_PLUGIN_PATH, the
// config's plugin_paths, then --plugin-path.
// Scans the build's, CPSCHED_PLUGIN_PATH's, the config's and --plugin-path
// folders; with `warn`, prints every file that could not be loaded to stderr.
void scan_plugins(Registry& reg, const Config* cfg, const std::vector<std::string>& extra_dirs, bool warn = true);

struct Solved {
  std::shared_ptr<const Problem> problem;
  std::shared_ptr<const TaskGrid> grid;
  Params solver_params;
  Assignment assignment;
  Metrics metrics;
  double solve_ms = 0;
};

}  // namespace cpsched::cli
