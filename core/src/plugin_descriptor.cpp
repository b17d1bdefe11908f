// Load-time checks of a plugin descriptor (DESIGN §8).
#include "plugin_descriptor.hpp"

#include <cstring>
#include <set>

#include "cpsched/error.hpp"

namespace cpsched::detail {

namespace {

// Names are config keys (`params: {<name>: ...}`) and file-name parts, so
// keep them to identifier-like text.
bool valid_name(const char* s) {
  if (s == nullptr) return false;
  const std::size_t n = std::strlen(s);
  if (n == 0 || n > 64) return false;
  const auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  if (!letter(s[0])) return false;
  for (std::size_t i = 1; i < n; ++i) {
    if (!letter(s[i]) && !digit(s[i]) && s[i] != '_' && s[i] != '-') return false;
  }
  return true;
}

std::string shown(const char* s) { return s == nullptr ? "(null)" : "'" + std::string(s) + "'"; }

ParamSpec read_param(const cpsched_param_spec& p, std::uint32_t index, const std::string& where) {
  const std::string which = "parameter #" + std::to_string(index);
  if (!valid_name(p.name)) {
    throw Error(where + ": " + which + " has an invalid name " + shown(p.name) +
                " (want a letter, then letters, digits, '_' or '-')");
  }
  const std::string named = "parameter '" + std::string(p.name) + "'";
  if (p.type < CPSCHED_PARAM_BOOL || p.type > CPSCHED_PARAM_STRING) {
    throw Error(where + ": " + named + " has unknown type " + std::to_string(p.type) +
                " (known: 0 bool, 1 int, 2 real, 3 string)");
  }
  ParamSpec spec;
  spec.name = p.name;
  spec.type = static_cast<ParamType>(p.type);
  spec.doc = p.doc == nullptr ? "" : p.doc;
  if (p.default_text == nullptr) {
    throw Error(where + ": " + named + " has no default value");
  }
  if (!parse_param(p.default_text, spec.type, spec.default_value)) {
    throw Error(where + ": " + named + " declares type " + std::string(to_string(spec.type)) +
                " but its default '" + p.default_text + "' is not " +
                (spec.type == ParamType::integer ? "an int" : "a " + std::string(to_string(spec.type))));
  }
  return spec;
}

}  // namespace

std::string plugin_file_label(const std::filesystem::path& file) {
  return "plugin file '" + file.string() + "'";
}

PluginInfo read_descriptor(const cpsched_plugin_descriptor_t& d, const std::filesystem::path& file) {
  const std::string where = plugin_file_label(file);
  if (d.abi_version != CPSCHED_PLUGIN_ABI_VERSION) {
    throw Error(where + ": plugin ABI version " + std::to_string(d.abi_version) +
                " differs from the host's " + std::to_string(CPSCHED_PLUGIN_ABI_VERSION) +
                "; rebuild the plugin against this cpsched");
  }
  // A shorter descriptor would make us read past the plugin's object.
  if (d.descriptor_size < sizeof(cpsched_plugin_descriptor_t)) {
    throw Error(where + ": descriptor size " + std::to_string(d.descriptor_size) +
                " is smaller than the host's " + std::to_string(sizeof(cpsched_plugin_descriptor_t)));
  }
  const char* host_signature = CPSCHED_BUILD_SIGNATURE;
  if (d.build_signature == nullptr || std::strcmp(d.build_signature, host_signature) != 0) {
    throw Error(where + ": build signature " + shown(d.build_signature) + " differs from the host's '" +
                host_signature + "'; plugin and host must use the same compiler, standard library "
                "ABI and cpsched version");
  }
  if (d.kind != CPSCHED_KIND_SOLVER && d.kind != CPSCHED_KIND_COST_MODEL &&
      d.kind != CPSCHED_KIND_EXECUTOR) {
    throw Error(where + ": unknown plugin kind " + std::to_string(d.kind) +
                " (known: 1 solver, 2 cost_model, 3 executor)");
  }
  if (!valid_name(d.name)) {
    throw Error(where + ": invalid plugin name " + shown(d.name) +
                " (want a letter, then letters, digits, '_' or '-'; at most 64)");
  }
  PluginInfo info;
  info.name = d.name;
  info.kind = static_cast<PluginKind>(d.kind);
  info.doc = d.doc == nullptr ? "" : d.doc;
  info.file = file;
  const std::string named = where + " (plugin '" + info.name + "')";
  if (d.num_params > 0 && d.params == nullptr) {
    throw Error(named + ": declares " + std::to_string(d.num_params) + " parameters but no table");
  }
  std::set<std::string> seen;
  for (std::uint32_t i = 0; i < d.num_params; ++i) {
    ParamSpec spec = read_param(d.params[i], i, named);
    if (!seen.insert(spec.name).second) {
      throw Error(named + ": parameter '" + spec.name + "' is declared twice");
    }
    info.params.push_back(std::move(spec));
  }
  if (d.create == nullptr || d.destroy == nullptr) {
    throw Error(named + ": descriptor lacks its create/destroy functions");
  }
  return info;
}

}  // namespace cpsched::detail
