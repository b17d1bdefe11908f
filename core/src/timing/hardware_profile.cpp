#include "cpsched/timing/hardware.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "timing/bundled_profiles.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/io/input_file.hpp"

namespace cpsched {

namespace {

// Locates messages: "<source>:<line>:<col>: key 'a.b': ...".
struct Ctx {
  const std::string& source;
  std::string where(const YAML::Node& n, const std::string& key) const {
    const YAML::Mark m = n.Mark();
    if (m.line >= 0) return fmt::format("{}:{}:{}: key '{}'", source, m.line + 1, m.column + 1, key);
    return fmt::format("{}: key '{}'", source, key);
  }
};

void check_keys(const Ctx& c, const YAML::Node& map, const std::string& path,
                const std::vector<std::string>& known) {
  if (!map.IsMap()) throw Error(c.where(map, path) + ": expected a mapping");
  for (const auto& kv : map) {
    const std::string k = kv.first.as<std::string>();
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      std::string list;
      for (const std::string& s : known) list += (list.empty() ? "" : ", ") + s;
      throw Error(fmt::format("{}: unknown key (known: {})", c.where(kv.first, path.empty() ? k : path + "." + k),
                              list));
    }
  }
}

YAML::Node require(const Ctx& c, const YAML::Node& map, const std::string& key, const std::string& path) {
  const YAML::Node n = map[key];
  if (!n) throw Error(fmt::format("{}: missing key '{}'", c.where(map, path.empty() ? "<root>" : path), key));
  return n;
}

// Every number of a profile is finite and inside a stated range: an infinite
// or absurd value would make every predicted time infinite (or overflow to
// it), and the timelines drawn from them unbounded. The ranges leave room
// far beyond any machine: up to 10^6 TFLOP/s and GB/s, a latency up to one
// second, up to 1024 GPUs per node.
struct Bounds {
  double lo;
  bool lo_open;  // lo itself excluded (a rate must be > 0)
  double hi;
};
constexpr Bounds kRate{0.0, true, 1e6};
constexpr Bounds kLatencyUs{0.0, false, 1e6};
constexpr Bounds kGpusPerNode{1.0, false, 1024.0};

double number(const Ctx& c, const YAML::Node& map, const std::string& key, const std::string& path, Bounds b) {
  const YAML::Node n = require(c, map, key, path);
  const std::string full = path.empty() ? key : path + "." + key;
  double v = 0;
  try {
    v = n.as<double>();
  } catch (const YAML::Exception&) {
    throw Error(c.where(n, full) + ": expected a number, got '" + (n.IsScalar() ? n.Scalar() : std::string("a ") + (n.IsMap() ? "map" : "list")) + "'");
  }
  if (!std::isfinite(v))
    throw Error(fmt::format("{}: must be a finite number (got {})", c.where(n, full), n.Scalar()));
  if (b.lo_open ? !(v > b.lo) : !(v >= b.lo))
    throw Error(fmt::format("{}: must be {} {:g} (got {})", c.where(n, full), b.lo_open ? ">" : ">=", b.lo, n.Scalar()));
  if (v > b.hi) throw Error(fmt::format("{}: must be at most {:g} (got {})", c.where(n, full), b.hi, n.Scalar()));
  return v;
}

Link parse_link(const Ctx& c, const YAML::Node& root, const std::string& key) {
  const YAML::Node n = require(c, root, key, "");
  check_keys(c, n, key, {"bandwidth_gb_s", "latency_us"});
  return {number(c, n, "bandwidth_gb_s", key, kRate), number(c, n, "latency_us", key, kLatencyUs)};
}

}  // namespace

HardwareProfile parse_hardware_profile(const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw Error(fmt::format("{}:{}:{}: invalid YAML: {}", source, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  const Ctx c{source};
  if (!root.IsMap()) throw Error(source + ": a hardware profile must be a YAML mapping");
  check_keys(c, root, "",
             {"name", "description", "attention_tflops", "hbm_gb_s", "gpus_per_node", "intra_node", "inter_node",
              "overlap"});
  HardwareProfile p;
  p.source = source;
  p.name = require(c, root, "name", "").as<std::string>();
  if (root["description"]) p.description = root["description"].as<std::string>();
  const YAML::Node tf = require(c, root, "attention_tflops", "");
  check_keys(c, tf, "attention_tflops", {"fwd", "bwd"});
  p.fwd_tflops = number(c, tf, "fwd", "attention_tflops", kRate);
  p.bwd_tflops = number(c, tf, "bwd", "attention_tflops", kRate);
  p.hbm_gb_s = number(c, root, "hbm_gb_s", "", kRate);
  const double gpn = number(c, root, "gpus_per_node", "", kGpusPerNode);
  if (gpn != static_cast<double>(static_cast<int>(gpn)))
    throw Error(c.where(root["gpus_per_node"], "gpus_per_node") + ": must be an integer");
  p.gpus_per_node = static_cast<int>(gpn);
  p.intra_node = parse_link(c, root, "intra_node");
  p.inter_node = parse_link(c, root, "inter_node");
  const YAML::Node ov = require(c, root, "overlap", "");
  try {
    p.overlap = ov.as<bool>();
  } catch (const YAML::Exception&) {
    throw Error(c.where(ov, "overlap") + ": expected true or false, got '" + ov.Scalar() + "'");
  }
  return p;
}

HardwareProfile load_hardware_profile(const std::filesystem::path& file) {
  // A profile is a few hundred bytes: a regular file of at most 1 MiB.
  return parse_hardware_profile(read_input_file(file, 1u << 20, "hardware profile"), file.string());
}

std::vector<std::string> bundled_hardware_names() {
  std::vector<std::string> names;
  for (const auto& [name, text] : bundled_profile_texts()) names.emplace_back(name);
  return names;
}

HardwareProfile resolve_hardware_profile(const std::string& spec) {
  const bool is_path = spec.find('/') != std::string::npos || spec.ends_with(".yaml") || spec.ends_with(".yml");
  if (is_path) return load_hardware_profile(spec);
  for (const auto& [name, text] : bundled_profile_texts())
    if (name == spec) return parse_hardware_profile(std::string(text), "bundled:" + spec);
  std::string list;
  for (const std::string& n : bundled_hardware_names()) list += (list.empty() ? "" : ", ") + n;
  throw Error(fmt::format("unknown hardware profile '{}' (bundled: {}; or give a path to a YAML file)", spec,
                          list));
}

}  // namespace cpsched
