// `--set key.path=value`: the value is parsed as YAML and replaces (or
// creates) the node at that path, before validation, so an override can swap
// a whole section (`--set "problem.mask={kind: causal, seed: 1}"`).
#include <string>
#include <vector>

#include "config/reader.hpp"

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

// Key paths are bounded: a config is never deeper than a few levels, and a
// bound keeps a hostile `--set` from costing time and memory.
constexpr std::size_t kMaxPathParts = 64;
constexpr std::size_t kMaxPathChars = 1024;

std::string shown_path(const std::string& path) {
  return path.size() <= 80 ? path : path.substr(0, 60) + "...(" + std::to_string(path.size()) + " characters)";
}

// "'a.b' is '8', not a map" for the first n keys (built by appending: GCC 12
// warns falsely about "'" + std::string temporaries here).
std::string not_a_map(const std::vector<std::string>& keys, std::size_t n, const YAML::Node& node) {
  std::string why = "'";
  for (std::size_t k = 0; k < n; ++k) {
    if (k > 0) why += '.';
    why += keys[k];
  }
  why += "' is ";
  why += describe(node);
  why += ", not a map";
  return why;
}

// Descends through maps (creating missing or null ones) and sets the last key,
// in place. A loop, not recursion: the depth is the key's number of parts.
// `cur.reset(child)` re-seats the handle (assignment would overwrite the node
// it refers to).
bool set_in_place(YAML::Node& root, const std::vector<std::string>& keys, const YAML::Node& value, std::string& why) {
  YAML::Node cur;
  cur.reset(root);
  for (std::size_t i = 0; i + 1 < keys.size(); ++i) {
    YAML::Node child = cur[keys[i]];
    if (!child.IsDefined() || child.IsNull()) {
      cur[keys[i]] = YAML::Node(YAML::NodeType::Map);
      child.reset(cur[keys[i]]);
    } else if (!child.IsMap()) {
      why = not_a_map(keys, i + 1, child);
      return false;
    }
    cur.reset(child);
  }
  cur[keys.back()] = value;
  return true;
}

// The same, for a document with YAML aliases: there a node can be reached by
// several paths (`b: *a` shares a's node), and setting it in place would change
// every alias too. So the maps along the path are rebuilt as new nodes holding
// the same entries in the same order, with the one entry on the path replaced;
// the other entries, and every other use of an alias, stay untouched.
bool set_unshared(YAML::Node& root, const std::vector<std::string>& keys, const YAML::Node& value, std::string& why) {
  // chain[i]: the existing map at keys[0..i) (chain[0] is the root).
  std::vector<YAML::Node> chain{root};
  for (std::size_t i = 0; i + 1 < keys.size(); ++i) {
    const YAML::Node& parent = chain.back();
    const YAML::Node child = static_cast<const YAML::Node&>(parent)[keys[i]];
    if (!child.IsDefined() || child.IsNull()) break;
    if (!child.IsMap()) {
      why = not_a_map(keys, i + 1, child);
      return false;
    }
    chain.push_back(child);
  }
  YAML::Node node = value;
  for (std::size_t j = keys.size(); j-- > 0;) {
    YAML::Node m(YAML::NodeType::Map);
    bool replaced = false;
    if (j < chain.size()) {
      for (auto it = chain[j].begin(); it != chain[j].end(); ++it) {
        if (!replaced && it->first.IsScalar() && it->first.Scalar() == keys[j]) {
          m.force_insert(it->first, node);
          replaced = true;
        } else {
          m.force_insert(it->first, it->second);
        }
      }
    }
    if (!replaced) m.force_insert(keys[j], node);
    node.reset(m);
  }
  root.reset(node);
  return true;
}

}  // namespace

void apply_overrides(YAML::Node& root, const std::vector<std::string>& overrides, Diagnostics& diag,
                     bool may_alias) {
  for (const std::string& o : overrides) {
    const std::size_t eq = o.find('=');
    if (eq == std::string::npos) {
      diag.add("--set '" + shown_path(o) + "': expected key.path=value (e.g. --set solver.name=usp)");
      continue;
    }
    const std::string path = o.substr(0, eq);
    if (path.size() > kMaxPathChars) {
      diag.add("--set '" + shown_path(path) + "': the key path is too long (at most " +
               std::to_string(kMaxPathChars) + " characters)");
      continue;
    }
    const std::vector<std::string> keys = split_path(path);
    if (keys.size() > kMaxPathParts) {
      diag.add("--set '" + shown_path(path) + "': the key path has " + std::to_string(keys.size()) +
               " parts (at most " + std::to_string(kMaxPathParts) + ")");
      continue;
    }
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
    // A value may bring its own aliases, which a later --set must not change through.
    may_alias = may_alias || o.find('*', eq + 1) != std::string::npos;
    std::string why;
    if (!(may_alias ? set_unshared(root, keys, value, why) : set_in_place(root, keys, value, why))) {
      diag.add("--set " + path + ": cannot set it: " + why);
      continue;
    }
    diag.add_override(path);
  }
}

}  // namespace cpsched::config_detail
