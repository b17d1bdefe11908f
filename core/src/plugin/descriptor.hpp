#pragma once
// Internal: turns a plugin's exported descriptor into a checked PluginInfo.
#include <filesystem>
#include <string>

#include "cpsched/plugin/abi.hpp"
#include "cpsched/plugin/registry.hpp"
#include "plugin/elf_inspect.hpp"

namespace cpsched::detail {

// "plugin file '<path>'": how every load-time message starts.
std::string plugin_file_label(const std::filesystem::path& file);

// Bounds on what a descriptor may declare; checked before anything is read.
inline constexpr std::size_t kMaxDescriptorText = 4096;  // signature, doc, defaults, parameter docs
inline constexpr std::uint32_t kMaxParams = 1024;

// Checks, in this order: ABI version, descriptor size, build signature, kind,
// name, parameter schema, factory pointers. Reads nothing beyond the fields
// it has proven to exist: the descriptor, every string (scanned at most
// kMaxDescriptorText bytes) and the parameter table must lie inside the
// plugin's own loaded image, and create/destroy in its code. Throws
// cpsched::Error naming `file` and the fault.
PluginInfo read_descriptor(const void* descriptor, const LoadedImage& image, const std::filesystem::path& file);

}  // namespace cpsched::detail
