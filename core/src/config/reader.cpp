// Located reading of a YAML tree for the configuration (see config_reader.hpp).
#include "config/reader.hpp"

#include <algorithm>

#include "cpsched/base/error.hpp"

namespace cpsched::config_detail {

std::string join_path(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

std::string located(const Location& loc, const std::string& path, const std::string& message) {
  std::string s = loc.str();
  if (!path.empty()) s += s.empty() ? path : ": " + path;
  return s.empty() ? message : s + ": " + message;
}

Location Diagnostics::where(const YAML::Node& node, const std::string& path) const {
  for (auto it = overrides_.rbegin(); it != overrides_.rend(); ++it) {
    const std::string& o = *it;
    // Below the override: a key under it (".") or an element of a list it set ("[").
    if (path == o || (path.size() > o.size() && path.compare(0, o.size(), o) == 0 &&
                      (path[o.size()] == '.' || path[o.size()] == '[')))
      return Location{"--set " + o, 0, 0};
  }
  Location loc{source_, 0, 0};
  if (node.IsDefined()) {
    const YAML::Mark m = node.Mark();
    if (!m.is_null()) {
      loc.line = m.line + 1;  // yaml-cpp counts from 0
      loc.column = m.column + 1;
    }
  }
  return loc;
}

void Diagnostics::throw_if_any() const {
  if (errors_.empty()) return;
  // In file order (the order they were found follows the schema, not the
  // text); errors without a position (`--set`) keep their order, last.
  std::vector<Entry> sorted = errors_;
  const auto key = [](const Entry& e) {
    return std::pair(e.line > 0 ? e.line : std::numeric_limits<int>::max(), e.column);
  };
  std::stable_sort(sorted.begin(), sorted.end(), [&](const Entry& a, const Entry& b) { return key(a) < key(b); });
  std::string msg;
  for (const Entry& e : sorted) {
    if (!msg.empty()) msg += '\n';
    msg += e.text;
  }
  throw Error(msg);
}

std::string describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing";
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a sequence";
  if (!is_plain_scalar(node)) return "the quoted string \"" + node.Scalar() + "\"";
  return "'" + node.Scalar() + "'";
}

bool is_plain_scalar(const YAML::Node& node) { return node.IsScalar() && node.Tag() == "?"; }

ParamValue typed_scalar(const YAML::Node& node) {
  if (is_plain_scalar(node)) {
    for (ParamType t : {ParamType::boolean, ParamType::integer, ParamType::real}) {
      ParamValue v;
      if (parse_param(node.Scalar(), t, v)) return v;
    }
  }
  return node.Scalar();
}

namespace {

std::string known_list(const std::vector<std::string>& known) {
  std::string s;
  for (const std::string& k : known) s += (s.empty() ? "" : ", ") + k;
  return s;
}

}  // namespace

Section::Section(Diagnostics& diag, const YAML::Node& node, std::string path, std::vector<std::string> known)
    // An absent key gives an "invalid" yaml-cpp node that cannot be re-seated
    // later, so the empty stand-in map is chosen here.
    : diag_(diag),
      node_(node.IsDefined() && node.IsMap() ? node : YAML::Node(YAML::NodeType::Map)),
      path_(std::move(path)) {
  if (!node.IsDefined() || node.IsNull()) return;
  if (!node.IsMap()) {
    diag_.error(node, path_, "expected a map with keys " + known_list(known) + ", got " + describe(node));
    valid_ = false;
    return;
  }
  std::vector<std::pair<std::string, YAML::Node>> seen;
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    const YAML::Node key = it->first;
    if (!key.IsScalar()) {
      diag_.error(key, path_, "map keys must be names, got " + describe(key));
      continue;
    }
    const std::string name = key.Scalar();
    const std::string kpath = join_path(path_, name);
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      diag_.error(key, kpath, "unknown key '" + name + "'; known keys: " + known_list(known));
      continue;
    }
    const auto first = std::find_if(seen.begin(), seen.end(), [&](const auto& p) { return p.first == name; });
    if (first != seen.end()) {
      const Location at = diag_.where(first->second, kpath);
      diag_.error(key, kpath, "duplicate key '" + name + "' (first given at " + at.str() + ")");
      continue;
    }
    seen.emplace_back(name, key);
  }
}

bool Section::has(const std::string& key) const {
  const YAML::Node v = node_[key];
  return v.IsDefined();
}

YAML::Node Section::get(const std::string& key) const {
  // yaml-cpp's "invalid" node for an absent key throws on most calls; hand
  // out a plain null node instead (has() tells absence apart).
  const YAML::Node v = node_[key];
  return v.IsDefined() ? v : YAML::Node();
}

Location Section::where(const std::string& key) const { return diag_.where(get(key), path(key)); }

void Section::error(const std::string& key, const std::string& message) const {
  diag_.error(has(key) ? get(key) : node_, path(key), message);
}

bool Section::require(const std::string& key) const {
  if (has(key)) return true;
  diag_.error(node_, path_, "missing required key '" + key + "'");
  return false;
}

bool node_int(Diagnostics& diag, const YAML::Node& node, const std::string& path, std::int64_t& out,
              std::int64_t min, std::int64_t max) {
  ParamValue v;
  if (!is_plain_scalar(node) || !parse_param(node.Scalar(), ParamType::integer, v)) {
    diag.error(node, path, "expected an integer, got " + describe(node));
    return false;
  }
  const std::int64_t i = std::get<std::int64_t>(v);
  if (i < min || i > max) {
    const std::string bound = i < min ? ">= " + std::to_string(min) : "<= " + std::to_string(max);
    diag.error(node, path, "must be " + bound + ", got " + std::to_string(i));
    return false;
  }
  out = i;
  return true;
}

bool node_string(Diagnostics& diag, const YAML::Node& node, const std::string& path, std::string& out) {
  if (!node.IsScalar()) {
    diag.error(node, path, "expected a string, got " + describe(node));
    return false;
  }
  out = node.Scalar();
  return true;
}

bool Section::read_int(const std::string& key, std::int64_t& out, std::int64_t min, std::int64_t max) const {
  if (!has(key)) return false;
  return node_int(diag_, get(key), path(key), out, min, max);
}

bool Section::read_int(const std::string& key, int& out, int min, int max) const {
  std::int64_t v = 0;
  if (!read_int(key, v, min, max)) return false;
  out = static_cast<int>(v);
  return true;
}

bool Section::read_real(const std::string& key, double& out, double min, double max) const {
  if (!has(key)) return false;
  const YAML::Node n = get(key);
  ParamValue v;
  if (!is_plain_scalar(n) || !parse_param(n.Scalar(), ParamType::real, v)) {
    diag_.error(n, path(key), "expected a number, got " + describe(n));
    return false;
  }
  const double d = std::get<double>(v);
  if (!(d >= min && d <= max)) {
    diag_.error(n, path(key), "must be in [" + format_param(min) + ", " + format_param(max) + "], got " + n.Scalar());
    return false;
  }
  out = d;
  return true;
}

bool Section::read_bool(const std::string& key, bool& out) const {
  if (!has(key)) return false;
  const YAML::Node n = get(key);
  ParamValue v;
  if (!is_plain_scalar(n) || !parse_param(n.Scalar(), ParamType::boolean, v)) {
    diag_.error(n, path(key), "expected true or false, got " + describe(n));
    return false;
  }
  out = std::get<bool>(v);
  return true;
}

bool Section::read_string(const std::string& key, std::string& out) const {
  if (!has(key)) return false;
  return node_string(diag_, get(key), path(key), out);
}

}  // namespace cpsched::config_detail
