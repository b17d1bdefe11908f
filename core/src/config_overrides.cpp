// `--set key.path=value`: the value is parsed as YAML and replaces (or
// creates) the node at that path, before validation, so an override can swap
// a whole section (`--set "problem.mask={kind: causal, seed: 1}"`).
#include <string>
#include <vector>

#include "config_reader.hpp"

namespace cpsched::config_detail {

namespace {

bool valid_key(const std::string& k) {
  if (k.empty()) return false;
  for (char c : k) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> keys;
  std::size_t b = 0;
  for (;;) {
    const std::size_t dot = path.find('.', b);
    keys.push_back(path.substr(b, dot == std::string::npos ? std::string::npos : dot - b));
    if (dot == std::string::npos) return keys;
    b = dot + 1;
  }
}

// Descends through maps (creating missing or null ones) and sets the last key.
// Written recursively: re-seating a YAML::Node handle by assignment would
// overwrite the node it refers to instead.
bool set_at(YAML::Node map, const std::vector<std::string>& keys, std::size_t i, const YAML::Node& value,
            std::string& why) {
  if (i + 1 == keys.size()) {
    map[keys[i]] = value;
    return true;
  }
  YAML::Node child = map[keys[i]];
  if (!child.IsDefined() || child.IsNull()) {
    map[keys[i]] = YAML::Node(YAML::NodeType::Map);
    child.reset(map[keys[i]]);
  } else if (!child.IsMap()) {
    std::string where;
    for (std::size_t k = 0; k <= i; ++k) where += (k ? "." : "") + keys[k];
    why = "'" + where + "' is " + describe(child) + ", not a map";
    return false;
  }
  return set_at(child, keys, i + 1, value, why);
}

}  // namespace

void apply_overrides(YAML::Node& root, const std::vector<std::string>& overrides, Diagnostics& diag) {
  for (const std::string& o : overrides) {
    const std::size_t eq = o.find('=');
    if (eq == std::string::npos) {
      diag.add("--set '" + o + "': expected key.path=value (e.g. --set solver.name=usp)");
      continue;
    }
    const std::string path = o.substr(0, eq);
    const std::vector<std::string> keys = split_path(path);
    bool keys_ok = true;
    for (const std::string& k : keys) keys_ok = keys_ok && valid_key(k);
    if (!keys_ok) {
      diag.add("--set '" + o + "': bad key path '" + path +
               "' (dot-separated names of letters, digits, '_' and '-')");
      continue;
    }
    YAML::Node value;
    try {
      value = YAML::Load(o.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      diag.add("--set " + path + ": the value is not valid YAML: " + e.msg + " (column " +
               std::to_string(e.mark.column + 1) + " of the value)");
      continue;
    }
    if (!root.IsDefined() || root.IsNull()) root.reset(YAML::Node(YAML::NodeType::Map));
    if (!root.IsMap()) {
      diag.add("--set " + path + ": the configuration is not a map, nothing to set");
      continue;
    }
    std::string why;
    if (!set_at(root, keys, 0, value, why)) {
      diag.add("--set " + path + ": cannot set it: " + why);
      continue;
    }
    diag.add_override(path);
  }
}

}  // namespace cpsched::config_detail
