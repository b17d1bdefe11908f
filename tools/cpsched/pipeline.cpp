#include "pipeline.hpp"

namespace cpsched::cli {

void scan_plugins(Registry& reg, const Config* cfg, const std::vector<std::string>& extra_dirs) {
  reg.scan(Registry::default_plugin_dir());
  for (const auto& d : Registry::env_plugin_dirs()) reg.scan(d);
  if (cfg != nullptr)
    for (const auto& d : cfg->plugin_paths) reg.scan(d);
  for (const auto& d : extra_dirs) reg.scan(d);
}

}  // namespace cpsched::cli
