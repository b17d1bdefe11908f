#pragma once
// Where the commands find plugins.
#include <memory>
#include <string>
#include <vector>

#include "cpsched/config/config.hpp"
#include "cpsched/plugin/registry.hpp"

namespace cpsched::cli {

// Plugin folders: the build's/installation's, CPSCHED_PLUGIN_PATH, the
// config's plugin_paths, then --plugin-path.
// Scans the build's, CPSCHED_PLUGIN_PATH's, the config's and --plugin-path
// folders; with `warn`, prints every file that could not be loaded to stderr.
void scan_plugins(Registry& reg, const Config* cfg, const std::vector<std::string>& extra_dirs, bool warn = true);


}  // namespace cpsched::cli
