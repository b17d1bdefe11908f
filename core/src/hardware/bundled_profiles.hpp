#pragma once
// The YAML texts of configs/hardware/*.yaml, embedded at build time so that a
// bundled name works wherever the plugin is installed (generated source).
#include <string_view>
#include <utility>
#include <vector>

namespace cpsched {

// (name, yaml text), sorted by name.
const std::vector<std::pair<std::string_view, std::string_view>>& bundled_profile_texts();

}  // namespace cpsched
