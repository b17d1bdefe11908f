#include "commands/plugin_folders.hpp"

#include <filesystem>
#include <fmt/format.h>

#include "cpsched/base/error.hpp"

namespace cpsched::cli {

void scan_plugins(Registry& reg, const Config* cfg, const std::vector<std::string>& extra_dirs, bool warn) {
  reg.scan_default_folders(cfg != nullptr ? cfg->plugin_paths : std::vector<std::filesystem::path>{});
  for (const auto& d : extra_dirs) {
    // A folder the user names must exist: a typo would otherwise just mean "plugin not found".
    std::error_code ec;
    if (!std::filesystem::is_directory(d, ec))
      throw Error(fmt::format("--plugin-path '{}': {}", d,
                              std::filesystem::exists(d, ec) ? "not a folder" : "no such folder"));
    reg.scan(d);
  }
  // `cpsched plugins` lists them itself; every other command says once on
  // stderr which plugin files were skipped, so a missing solver is explained.
  if (warn)
    for (const PluginProblem& p : reg.problems())
      fmt::print(stderr, "cpsched: warning: skipped a plugin file: {}\n", p.message);
}

}  // namespace cpsched::cli
