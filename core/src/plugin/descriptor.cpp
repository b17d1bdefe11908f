// Load-time checks of a plugin descriptor (docs/design.md#plugins).
#include "plugin/descriptor.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <set>

#include "cpsched/base/error.hpp"

namespace cpsched::detail {

namespace {

// A C string the plugin points to, read without running past its image or
// `max` bytes. Returns false with `why` set when it cannot be read whole.
bool bounded_text(const char* s, const LoadedImage& image, std::size_t max, std::string& out, std::string& why) {
  if (s == nullptr) {
    why = "is null";
    return false;
  }
  const std::size_t room = image.room(s);
  if (room == 0) {
    why = "points outside the plugin's loaded image";
    return false;
  }
  const std::size_t limit = std::min(room, max + 1);
  const void* nul = std::memchr(s, '\0', limit);
  if (nul == nullptr) {
    why = room <= max ? "runs past the end of the plugin's image" : "is longer than " + std::to_string(max) + " bytes";
    return false;
  }
  out.assign(s, static_cast<const char*>(nul));
  return true;
}

// Names are config keys (`params: {<name>: ...}`) and file-name parts, so
// keep them to identifier-like text.
bool valid_name(const std::string& s) {
  const std::size_t n = s.size();
  if (n == 0 || n > 64) return false;
  const auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  if (!letter(s[0])) return false;
  for (std::size_t i = 1; i < n; ++i) {
    if (!letter(s[i]) && !digit(s[i]) && s[i] != '_' && s[i] != '-') return false;
  }
  return true;
}

std::string shown(const std::string& s) { return "'" + s + "'"; }

// A string field of the descriptor, or an error "<where>: <field> <why>".
std::string text_field(const char* s, const LoadedImage& image, std::size_t max, const std::string& where,
                       const std::string& field, bool null_is_empty = false) {
  if (s == nullptr && null_is_empty) return {};
  std::string out, why;
  if (!bounded_text(s, image, max, out, why)) throw Error(where + ": " + field + " " + why);
  return out;
}

ParamSpec read_param(const cpsched_param_spec& p, std::uint32_t index, const LoadedImage& image,
                     const std::string& where) {
  const std::string which = "parameter #" + std::to_string(index);
  const std::string name = text_field(p.name, image, 64, where, which + "'s name");
  if (!valid_name(name)) {
    throw Error(where + ": " + which + " has an invalid name " + shown(name) +
                " (want a letter, then letters, digits, '_' or '-')");
  }
  const std::string named = "parameter '" + name + "'";
  if (p.type < CPSCHED_PARAM_BOOL || p.type > CPSCHED_PARAM_STRING) {
    throw Error(where + ": " + named + " has unknown type " + std::to_string(p.type) +
                " (known: 0 bool, 1 int, 2 real, 3 string)");
  }
  ParamSpec spec;
  spec.name = name;
  spec.type = static_cast<ParamType>(p.type);
  spec.doc = text_field(p.doc, image, kMaxDescriptorText, where, named + "'s doc", true);
  if (p.default_text == nullptr) {
    throw Error(where + ": " + named + " has no default value");
  }
  const std::string default_text = text_field(p.default_text, image, kMaxDescriptorText, where, named + "'s default");
  if (!parse_param(default_text, spec.type, spec.default_value)) {
    throw Error(where + ": " + named + " declares type " + std::string(to_string(spec.type)) +
                " but its default '" + default_text + "' is not " +
                (spec.type == ParamType::integer ? "an int" : "a " + std::string(to_string(spec.type))));
  }
  return spec;
}

}  // namespace

std::string plugin_file_label(const std::filesystem::path& file) {
  return "plugin file '" + file.string() + "'";
}

PluginInfo read_descriptor(const void* descriptor, const LoadedImage& image, const std::filesystem::path& file) {
  const std::string where = plugin_file_label(file);
  // abi_version and descriptor_size first: they say how much more to read.
  constexpr std::size_t head = offsetof(cpsched_plugin_descriptor_t, descriptor_size) + sizeof(std::uint32_t);
  if (!image.holds(descriptor, head)) {
    throw Error(where + ": its '" CPSCHED_STR(CPSCHED_PLUGIN_SYMBOL) "' does not point into the plugin's loaded image");
  }
  std::uint32_t abi_version = 0, descriptor_size = 0;
  std::memcpy(&abi_version, static_cast<const char*>(descriptor) + offsetof(cpsched_plugin_descriptor_t, abi_version),
              sizeof abi_version);
  std::memcpy(&descriptor_size,
              static_cast<const char*>(descriptor) + offsetof(cpsched_plugin_descriptor_t, descriptor_size),
              sizeof descriptor_size);
  if (abi_version != CPSCHED_PLUGIN_ABI_VERSION) {
    throw Error(where + ": plugin ABI version " + std::to_string(abi_version) +
                " differs from the host's " + std::to_string(CPSCHED_PLUGIN_ABI_VERSION) +
                "; rebuild the plugin against this cpsched");
  }
  // A shorter descriptor would make us read past the plugin's object.
  if (descriptor_size < sizeof(cpsched_plugin_descriptor_t)) {
    throw Error(where + ": descriptor size " + std::to_string(descriptor_size) +
                " is smaller than the host's " + std::to_string(sizeof(cpsched_plugin_descriptor_t)));
  }
  if (!image.holds(descriptor, sizeof(cpsched_plugin_descriptor_t))) {
    throw Error(where + ": its descriptor runs past the end of the plugin's loaded image");
  }
  const auto& d = *static_cast<const cpsched_plugin_descriptor_t*>(descriptor);
  const char* host_signature = CPSCHED_BUILD_SIGNATURE;
  std::string signature, why;
  if (!bounded_text(d.build_signature, image, kMaxDescriptorText, signature, why)) {
    throw Error(where + ": build signature " + why + "; the host's is '" + host_signature + "'");
  }
  if (signature != host_signature) {
    throw Error(where + ": build signature " + shown(signature) +
                " differs from the host's '" + host_signature +
                "'; plugin and host must use the same compiler, standard library "
                "ABI and cpsched version");
  }
  if (d.kind != CPSCHED_KIND_SOLVER && d.kind != CPSCHED_KIND_COST_MODEL &&
      d.kind != CPSCHED_KIND_EXECUTOR) {
    throw Error(where + ": unknown plugin kind " + std::to_string(d.kind) +
                " (known: 1 solver, 2 cost_model, 3 executor)");
  }
  std::string name;
  if (!bounded_text(d.name, image, 64, name, why)) throw Error(where + ": plugin name " + why);
  if (!valid_name(name)) {
    throw Error(where + ": invalid plugin name " + shown(name) +
                " (want a letter, then letters, digits, '_' or '-'; at most 64)");
  }
  PluginInfo info;
  info.name = name;
  info.kind = static_cast<PluginKind>(d.kind);
  info.file = file;
  const std::string named = where + " (plugin '" + info.name + "')";
  info.doc = text_field(d.doc, image, kMaxDescriptorText, named, "doc", true);
  if (d.num_params > kMaxParams) {
    throw Error(named + ": declares " + std::to_string(d.num_params) + " parameters, more than the " +
                std::to_string(kMaxParams) + " a plugin may have");
  }
  if (d.num_params > 0 && d.params == nullptr) {
    throw Error(named + ": declares " + std::to_string(d.num_params) + " parameters but no table");
  }
  if (d.num_params > 0 && !image.holds(d.params, std::size_t{d.num_params} * sizeof(cpsched_param_spec))) {
    throw Error(named + ": its table of " + std::to_string(d.num_params) +
                " parameters does not lie inside the plugin's loaded image");
  }
  std::set<std::string> seen;
  for (std::uint32_t i = 0; i < d.num_params; ++i) {
    ParamSpec spec = read_param(d.params[i], i, image, named);
    if (!seen.insert(spec.name).second) {
      throw Error(named + ": parameter '" + spec.name + "' is declared twice");
    }
    info.params.push_back(std::move(spec));
  }
  if (d.create == nullptr || d.destroy == nullptr) {
    throw Error(named + ": descriptor lacks its create/destroy functions");
  }
  if (!image.holds_code(reinterpret_cast<const void*>(d.create)) ||
      !image.holds_code(reinterpret_cast<const void*>(d.destroy))) {
    throw Error(named + ": its create/destroy functions are not code of the plugin itself");
  }
  return info;
}

}  // namespace cpsched::detail
