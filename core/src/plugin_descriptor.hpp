#pragma once
// Internal: turns a plugin's exported descriptor into a checked PluginInfo.
#include <filesystem>
#include <string>

#include "cpsched/plugin_abi.hpp"
#include "cpsched/registry.hpp"

namespace cpsched::detail {

// "plugin file '<path>'": how every load-time message starts.
std::string plugin_file_label(const std::filesystem::path& file);

// Checks, in this order: ABI version, descriptor size, build signature, kind,
// name, parameter schema, factory pointers. Reads nothing beyond the fields
// it has proven to exist. Throws cpsched::Error naming `file` and the fault.
PluginInfo read_descriptor(const cpsched_plugin_descriptor_t& d, const std::filesystem::path& file);

}  // namespace cpsched::detail
