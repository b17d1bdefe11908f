#pragma once
// Internal: reading a YAML tree with located errors. Every problem goes into
// Diagnostics (nothing throws while reading) so that a file's errors are all
// reported together.
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "cpsched/config/config.hpp"
#include "cpsched/plugin/params.hpp"

namespace cpsched::config_detail {

// "a.b" + "c" -> "a.b.c"
std::string join_path(const std::string& path, const std::string& key);
// "loc: key.path: message", leaving out what is unknown.
std::string located(const Location& loc, const std::string& path, const std::string& message);

class Diagnostics {
 public:
  explicit Diagnostics(std::string source) : source_(std::move(source)) {}

  // Key paths replaced by a `--set`, in the order applied.
  void add_override(std::string path) { overrides_.push_back(std::move(path)); }

  // Where the node at `path` came from: the last `--set` whose path is a
  // prefix of `path`, else the node's position in the file (1-based).
  Location where(const YAML::Node& node, const std::string& path) const;

  void error(const YAML::Node& node, const std::string& path, const std::string& message) {
    add_at(where(node, path), path, message);
  }
  void add_at(const Location& loc, const std::string& path, const std::string& message) {
    errors_.push_back({located(loc, path, message), loc.line, loc.column});
  }
  // An error without a position in the file (already formatted).
  void add(std::string formatted) { errors_.push_back({std::move(formatted), 0, 0}); }

  std::size_t count() const { return errors_.size(); }
  // Throws one cpsched::Error listing every error, one per line.
  void throw_if_any() const;

 private:
  struct Entry {
    std::string text;
    int line = 0;
    int column = 0;
  };
  std::string source_;
  std::vector<std::string> overrides_;
  std::vector<Entry> errors_;
};

// "'abc'", "a map", "a sequence", "nothing" — for "expected X, got Y".
std::string describe(const YAML::Node& node);
// A scalar written without quotes or tag (so `"8"` stays a string).
bool is_plain_scalar(const YAML::Node& node);
// Plugin parameter typing: plain true/false -> bool, plain decimal -> int,
// plain number -> real, anything else scalar -> string.
ParamValue typed_scalar(const YAML::Node& node);

// One YAML map of the schema: checks its keys against the known ones (unknown
// and duplicate keys are errors) and reads typed values. A null node reads as
// an empty map (`plan:` with nothing under it keeps the defaults). The read_*
// functions return true when the key is present and its value valid (then
// `out` is set); a present but invalid value is reported.
class Section {
 public:
  Section(Diagnostics& diag, const YAML::Node& node, std::string path, std::vector<std::string> known);

  bool valid() const { return valid_; }  // a map (or nothing)
  bool has(const std::string& key) const;
  YAML::Node get(const std::string& key) const;  // a null node when absent
  const YAML::Node& node() const { return node_; }
  const std::string& path() const { return path_; }
  std::string path(const std::string& key) const { return join_path(path_, key); }
  Location where(const std::string& key) const;
  Diagnostics& diag() const { return diag_; }

  // Reports a missing key at the map; returns whether it is there.
  bool require(const std::string& key) const;
  bool read_int(const std::string& key, std::int64_t& out, std::int64_t min,
                std::int64_t max = std::numeric_limits<std::int64_t>::max()) const;
  bool read_int(const std::string& key, int& out, int min, int max = std::numeric_limits<int>::max()) const;
  bool read_real(const std::string& key, double& out, double min, double max) const;
  bool read_bool(const std::string& key, bool& out) const;
  bool read_string(const std::string& key, std::string& out) const;
  void error(const std::string& key, const std::string& message) const;

 private:
  Diagnostics& diag_;
  YAML::Node node_;
  std::string path_;
  bool valid_ = true;
};

// Typed reads of a node that is not a map entry (list items).
bool node_int(Diagnostics& diag, const YAML::Node& node, const std::string& path, std::int64_t& out,
              std::int64_t min, std::int64_t max = std::numeric_limits<std::int64_t>::max());
bool node_string(Diagnostics& diag, const YAML::Node& node, const std::string& path, std::string& out);

// `--set key.path=value` overrides, applied to `root` (a map, made one when
// null). Syntax errors and impossible paths are reported; applied paths are
// registered with diag for locating. `may_alias`: the document may hold YAML
// aliases (then the nodes along a path are copied before the override, so that
// the alias's other uses keep their value).
void apply_overrides(YAML::Node& root, const std::vector<std::string>& overrides, Diagnostics& diag,
                     bool may_alias);

}  // namespace cpsched::config_detail
