#pragma once
// Internal: the `problem:` section of the configuration (sizes, heads, grid
// and the mask), read into Config with located errors.
#include <filesystem>

#include "config/reader.hpp"

namespace cpsched::config_detail {

// `base_dir`: the config file's folder, for relative histogram paths.
void read_problem(const Section& problem, Config& cfg, const std::filesystem::path& base_dir);

}  // namespace cpsched::config_detail
