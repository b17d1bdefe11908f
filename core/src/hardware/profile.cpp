#include "cpsched/hardware/profile.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "hardware/bundled_profiles.hpp"
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

constexpr Bounds kTile{1.0, false, 4096.0};
constexpr Bounds kLength{1.0, false, 2147483648.0};

int whole(const Ctx& c, const YAML::Node& map, const std::string& key, const std::string& path, Bounds b) {
  const double v = number(c, map, key, path, b);
  if (v != std::floor(v)) throw Error(c.where(map[key], path + "." + key) + ": must be a whole number");
  return static_cast<int>(v);
}

// A list of numbers in `b`; `whole`: integers.
std::vector<double> numbers(const Ctx& c, const YAML::Node& n, const std::string& path, Bounds b, bool integral) {
  if (!n.IsSequence() || n.size() == 0) throw Error(c.where(n, path) + ": expected a non-empty list of numbers");
  std::vector<double> out;
  for (std::size_t i = 0; i < n.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", path, i);
    double v = 0;
    try {
      v = n[i].as<double>();
    } catch (const YAML::Exception&) {
      throw Error(c.where(n[i], at) + ": expected a number, got '" + (n[i].IsScalar() ? n[i].Scalar() : "a list or map") +
                  "'");
    }
    if (!std::isfinite(v) || (b.lo_open ? !(v > b.lo) : !(v >= b.lo)) || v > b.hi)
      throw Error(fmt::format("{}: must be a finite number {} {:g} and at most {:g} (got {})", c.where(n[i], at),
                              b.lo_open ? ">" : ">=", b.lo, b.hi, n[i].Scalar()));
    if (integral && v != std::floor(v)) throw Error(c.where(n[i], at) + ": must be a whole number");
    if (integral && i > 0 && !(v > out.back()))
      throw Error(c.where(n[i], at) + ": lengths must be strictly ascending");
    out.push_back(v);
  }
  return out;
}

// One pass of the kernel model (kernel_model.hpp).
KernelRates parse_kernel_pass(const Ctx& c, const YAML::Node& kernel, const std::string& pass, double peak) {
  const std::string path = "kernel." + pass;
  const YAML::Node n = require(c, kernel, pass, "kernel");
  check_keys(c, n, path, {"tile", "call_us", "entry_us", "lengths", "tflops", "relative_to"});
  KernelRates r;
  const YAML::Node tile = require(c, n, "tile", path);
  check_keys(c, tile, path + ".tile", {"q", "k"});
  r.tile_q = whole(c, tile, "q", path + ".tile", kTile);
  r.tile_k = whole(c, tile, "k", path + ".tile", kTile);
  r.call_us = number(c, n, "call_us", path, kLatencyUs);
  r.entry_us = number(c, n, "entry_us", path, kLatencyUs);
  r.lengths = numbers(c, require(c, n, "lengths", path), path + ".lengths", kLength, true);
  const YAML::Node tf = require(c, n, "tflops", path);
  std::vector<std::string> forms;
  for (int f = 0; f < kKernelForms; ++f) forms.emplace_back(to_string(static_cast<KernelForm>(f)));
  check_keys(c, tf, path + ".tflops", forms);
  if (tf.size() == 0) throw Error(c.where(tf, path + ".tflops") + ": holds no mask form");
  for (const auto& kv : tf) {
    const std::string name = kv.first.as<std::string>();
    const auto f = static_cast<std::size_t>(std::find(forms.begin(), forms.end(), name) - forms.begin());
    const std::string at = path + ".tflops." + name;
    if (kv.second.IsScalar()) {  // another form's rates
      const std::string to = kv.second.Scalar();
      const auto t = std::find(forms.begin(), forms.end(), to);
      const YAML::Node target = tf[to];
      if (t == forms.end() || to == name || !target || !target.IsSequence())
        throw Error(fmt::format("{}: must be a list of TFLOP/s, one per length, or the name of another form of "
                                "this table with its own list (got '{}')",
                                c.where(kv.second, at), to));
      r.alias[f] = static_cast<int>(t - forms.begin());
      continue;
    }
    r.tflops[f] = numbers(c, kv.second, at, kRate, false);
    if (r.tflops[f].size() != r.lengths.size())
      throw Error(fmt::format("{}: {} rates for {} lengths", c.where(kv.second, at), r.tflops[f].size(),
                              r.lengths.size()));
  }
  // relative_to: the rates were measured where the best rate was this; they
  // are scaled to the profile's peak (another GPU of the same kind).
  if (n["relative_to"]) {
    const double ref = number(c, n, "relative_to", path, kRate);
    for (auto& row : r.tflops)
      for (double& v : row) v *= peak / ref;
  }
  try {
    r.finish();
  } catch (const Error& e) {
    throw Error(c.where(n, path) + ": " + e.what());
  }
  return r;
}

KernelModel parse_kernel(const Ctx& c, const YAML::Node& root, double fwd_peak, double bwd_peak) {
  const YAML::Node n = root["kernel"];
  check_keys(c, n, "kernel", {"fwd", "bwd"});
  return {parse_kernel_pass(c, n, "fwd", fwd_peak), parse_kernel_pass(c, n, "bwd", bwd_peak)};
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
             {"name", "description", "attention_tflops", "kernel", "hbm_gb_s", "gpus_per_node", "intra_node",
              "inter_node", "overlap"});
  HardwareProfile p;
  p.source = source;
  p.name = require(c, root, "name", "").as<std::string>();
  if (root["description"]) p.description = root["description"].as<std::string>();
  const YAML::Node tf = require(c, root, "attention_tflops", "");
  check_keys(c, tf, "attention_tflops", {"fwd", "bwd"});
  p.fwd_tflops = number(c, tf, "fwd", "attention_tflops", kRate);
  p.bwd_tflops = number(c, tf, "bwd", "attention_tflops", kRate);
  if (root["kernel"]) p.kernel = parse_kernel(c, root, p.fwd_tflops, p.bwd_tflops);
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
