#pragma once
// The path every command shares: config -> registry -> problem -> grid ->
// solver -> assignment -> metrics.
#include <memory>
#include <string>
#include <vector>

#include "cpsched/config.hpp"
#include "cpsched/metrics.hpp"
#include "cpsched/registry.hpp"

namespace cpsched::cli {

// Plugin folders: the build's/installation's, CPSCHED_PLUGIN_PATH, the
// config's plugin_paths, then --plugin-path.
void scan_plugins(Registry& reg, const Config* cfg, const std::vector<std::string>& extra_dirs);

struct Solved {
  std::shared_ptr<const Problem> problem;
  std::shared_ptr<const TaskGrid> grid;
  Params solver_params;
  Assignment assignment;
  Metrics metrics;
  double grid_ms = 0, solve_ms = 0, metrics_ms = 0;
};

// Resolves the config's solver and cost model against the registry (errors
// carry config locations) and runs the whole path.
Solved solve(const Config& cfg, const Registry& reg);

}  // namespace cpsched::cli
