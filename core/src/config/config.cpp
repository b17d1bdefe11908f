// Configuration (docs/design.md#configuration): YAML + `--set` overrides -> validated Config,
// every error located and all of them reported at once.
#include "cpsched/config/config.hpp"

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>

#include "config/problem.hpp"
#include "config/reader.hpp"
#include "problem/index_problem.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/io/input_file.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/base/memory_budget.hpp"
#include "cpsched/plugin/registry.hpp"

namespace cpsched {

using config_detail::Diagnostics;
using config_detail::located;
using config_detail::Section;

std::string Location::str() const {
  if (line <= 0) return source;
  return source + ":" + std::to_string(line) + ":" + std::to_string(column);
}

Params PluginSelection::given_params() const {
  Params p;
  for (const auto& [name, value] : given) p.set(name, value.first);
  return p;
}

namespace {

// A plugin section: `name` selects the plugin; `params` holds one block per
// plugin name. Only the selected block is read (others may belong to plugins
// that are not even installed); its values are typed from the YAML scalars.
void read_selection(const Section& top, const std::string& key, const std::string& default_name,
                    PluginSelection& sel) {
  Diagnostics& diag = top.diag();
  const Section s(diag, top.get(key), top.path(key), {"name", "params"});
  sel.name = default_name;
  sel.name_loc = diag.where(top.has(key) ? top.get(key) : top.node(), s.path());
  if (!s.valid()) return;
  if (top.has(key) && s.require("name") && s.read_string("name", sel.name)) sel.name_loc = s.where("name");
  sel.params_loc = diag.where(s.has("params") ? s.get("params") : s.node(), s.path("params"));
  if (!s.has("params")) return;
  const YAML::Node params = s.get("params");
  if (params.IsNull()) return;
  if (!params.IsMap()) {
    s.error("params", "expected a map of parameter blocks keyed by plugin name, got " +
                          config_detail::describe(params));
    return;
  }
  // Blocks of other plugins are not read, but each must be a block: a
  // parameter written straight under `params` would otherwise be ignored.
  for (auto it = params.begin(); it != params.end(); ++it)
    if (!it->second.IsMap() && !it->second.IsNull()) {
      const std::string name = it->first.Scalar();
      diag.error(it->second, config_detail::join_path(s.path("params"), name),
                 "expected the parameter block of a plugin named '" + name + "', got " +
                     config_detail::describe(it->second) + " (parameters go one level down: " + s.path("params") +
                     "." + sel.name + "." + name + ")");
    }
  const YAML::Node block = params[sel.name];
  const std::string bpath = config_detail::join_path(s.path("params"), sel.name);
  if (!block.IsDefined() || block.IsNull()) return;
  sel.params_loc = diag.where(block, bpath);
  if (!block.IsMap()) {
    diag.error(block, bpath, "expected a map of parameters, got " + config_detail::describe(block));
    return;
  }
  for (auto it = block.begin(); it != block.end(); ++it) {
    const YAML::Node v = it->second;
    const std::string name = it->first.Scalar();
    const std::string ppath = config_detail::join_path(bpath, name);
    if (!v.IsScalar()) {
      diag.error(v, ppath, "expected a scalar (bool, integer, real or string), got " + config_detail::describe(v));
      continue;
    }
    if (sel.given.count(name) != 0) {
      diag.error(it->first, ppath, "duplicate parameter '" + name + "'");
      continue;
    }
    sel.given[name] = {config_detail::typed_scalar(v), diag.where(v, ppath)};
  }
}

void read_plan(const Section& top, Config& cfg) {
  const Section plan(top.diag(), top.get("plan"), top.path("plan"), {"stages", "relay", "cache_size", "uses"});
  // `auto` (or 0): the solver chooses the stage count (Solution::shape).
  if (plan.has("stages") && plan.get("stages").IsScalar() && plan.get("stages").Scalar() == "auto")
    cfg.plan.stages = PlanShape::kAutoStages;
  else
    plan.read_int("stages", cfg.plan.stages, 0, PlanShape::kMaxStages);
  plan.read_int("cache_size", cfg.cache_size, 0);
  if (plan.has("uses")) {
    int n = 1;
    if (plan.get("uses").IsScalar() && plan.get("uses").Scalar() == "ahead") cfg.uses = PlanUses::ahead();
    else if (plan.read_int("uses", n, 1)) cfg.uses = PlanUses{n};
  }
  // `off` / `on` (YAML 1.1 reads them as booleans, so both spellings are taken) / `auto`.
  if (plan.has("relay")) {
    const YAML::Node v = plan.get("relay");
    const std::string s = v.IsScalar() ? v.Scalar() : std::string();
    if (s == "on" || s == "true") cfg.plan.relay = PlanShape::Relay::on;
    else if (s == "off" || s == "false") cfg.plan.relay = PlanShape::Relay::off;
    else if (s == "auto") cfg.plan.relay = PlanShape::Relay::automatic;
    else
      plan.error("relay",
                 "expected off, on or auto, got " + (v.IsScalar() ? "'" + s + "'" : config_detail::describe(v)));
  }
}

// `memory_budget: 16G` (a size with K/M/G/T, or bytes).
void read_memory_budget(const Section& top, Config& cfg) {
  if (!top.has("memory_budget")) return;
  const YAML::Node v = top.get("memory_budget");
  if (!v.IsScalar()) {
    top.error("memory_budget", "expected a size such as 16G, 512M or a number of bytes, got " + config_detail::describe(v));
    return;
  }
  try {
    cfg.memory_budget = parse_memory_size(v.Scalar(), "memory_budget");
  } catch (const Error& e) {
    top.error("memory_budget", e.what());
  }
}

void read_plugin_paths(const Section& top, Config& cfg, const std::filesystem::path& base_dir) {
  if (!top.has("plugin_paths")) return;
  const YAML::Node list = top.get("plugin_paths");
  if (list.IsNull()) return;
  if (!list.IsSequence()) {
    top.error("plugin_paths", "expected a list of folders, got " + config_detail::describe(list));
    return;
  }
  for (std::size_t i = 0; i < list.size(); ++i) {
    std::string dir;
    if (!config_detail::node_string(top.diag(), list[i], "plugin_paths[" + std::to_string(i) + "]", dir)) continue;
    std::filesystem::path p = dir;
    if (p.is_relative()) p = base_dir / p;
    // A folder the user names must exist: a typo would otherwise only mean "plugin not found".
    try {
      check_input_folder(p, "plugin folder");
    } catch (const Error& e) {
      top.diag().error(list[i], "plugin_paths[" + std::to_string(i) + "]", e.what());
      continue;
    }
    cfg.plugin_paths.push_back(p);
  }
}

// `hardware: NAME`: the profile for every plugin that declares a `hardware`
// parameter (the cost model and the executor), unless its own block sets one.
// A path is resolved from the config's folder; the profile is loaded here so
// that `check` reports a bad one at this key.
void read_hardware(const Section& top, Config& cfg, const std::filesystem::path& base_dir) {
  if (!top.has("hardware")) return;
  std::string spec;
  if (!top.read_string("hardware", spec)) return;
  cfg.hardware_loc = top.where("hardware");
  if (spec.empty()) {
    top.error("hardware", "expected a hardware profile name or a path to a profile YAML, got an empty string");
    return;
  }
  const bool is_path = spec.find('/') != std::string::npos || spec.ends_with(".yaml") || spec.ends_with(".yml");
  if (is_path && std::filesystem::path(spec).is_relative() && !base_dir.empty()) spec = (base_dir / spec).string();
  if (is_path) {
    // A profile is a small YAML file: a device or FIFO (/dev/zero) would be read without end.
    std::error_code ec;
    const auto st = std::filesystem::status(spec, ec);
    if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st)) {
      top.error("hardware", spec + ": not a regular file");
      return;
    }
  }
  try {
    (void)resolve_hardware_profile(spec);
  } catch (const Error& e) {
    top.error("hardware", e.what());
    return;
  }
  cfg.hardware = spec;
  if (is_path) cfg.input_files.emplace_back(spec, "hardware");
  for (PluginSelection* sel : {&cfg.cost_model, &cfg.executor})
    sel->inherited["hardware"] = {ParamValue(spec), cfg.hardware_loc};
}

std::string section_of(int kind) {
  switch (static_cast<PluginKind>(kind)) {
    case PluginKind::solver: return "solver";
    case PluginKind::cost_model: return "cost_model";
    case PluginKind::executor: return "executor";
  }
  return "plugin";
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& source,
                    const std::vector<std::string>& overrides) {
  Config cfg;
  cfg.file = source;
  const std::filesystem::path base_dir = std::filesystem::path(source).parent_path();
  Diagnostics diag(source);

  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    // The parser stops at the first syntax error: nothing more to check.
    throw Error(source + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) +
                ": YAML syntax error: " + e.msg);
  }
  // Aliases need a '*' somewhere in the text: without one, overrides may edit in place.
  config_detail::apply_overrides(root, overrides, diag, yaml_text.find('*') != std::string::npos);
  cfg.effective_yaml = YAML::Dump(root) + "\n";

  const Section top(diag, root, "",
                    {"problem", "solver", "cost_model", "plan", "executor", "plugin_paths", "compare",
                     "hardware", "memory_budget"});
  if (top.valid() && (!top.has("problem") || top.get("problem").IsNull())) {
    // Running the built-in defaults for an empty or truncated file would hide the mistake.
    const bool empty = !root.IsDefined() || root.IsNull() || root.size() == 0;
    diag.add(source + ": " + (empty ? "the configuration is empty" : "the configuration has no 'problem' section") +
             ": give the problem (cp_size, seqlen_per_rank, heads, mask) in the file or with --set problem...=");
  }
  if (top.valid()) {
    // First: the problem's own checks (generating the mask) use it.
    read_memory_budget(top, cfg);
    const Section problem(diag, top.get("problem"), "problem",
                          {"cp_size", "seqlen_per_rank", "heads", "grid", "mask", "layout", "host_ranges"});
    if (problem.valid()) config_detail::read_problem(problem, cfg, base_dir);
    read_selection(top, "solver", "balanced_bytes", cfg.solver);
    read_selection(top, "cost_model", "area", cfg.cost_model);
    read_selection(top, "executor", "sim", cfg.executor);
    read_plan(top, cfg);
    read_plugin_paths(top, cfg, base_dir);
    read_hardware(top, cfg, base_dir);
    if (top.has("compare")) {
      cfg.compare_yaml = YAML::Dump(top.get("compare"));
      cfg.compare_loc = top.where("compare");
    }
  }
  diag.throw_if_any();
  return cfg;
}

Config load_config(const std::filesystem::path& file, const std::vector<std::string>& overrides) {
  // Only a regular file of bounded size: /dev/zero or a FIFO would be read
  // without end (or block in open), and a config is a few kilobytes.
  constexpr std::uint64_t kMaxConfigBytes = 16u << 20;
  const std::string text = read_input_file(file, kMaxConfigBytes, "configuration file");
  return parse_config(text, file.string(), overrides);
}

Params resolve_selection(const Registry& reg, int kind, const PluginSelection& sel) {
  const std::string section = section_of(kind);
  const PluginInfo* info = nullptr;
  try {
    info = &reg.find(static_cast<PluginKind>(kind), sel.name);
  } catch (const Error& e) {
    throw Error(located(sel.name_loc, section + ".name", e.what()));
  }
  // One parameter at a time first, so that each error points at its value.
  const std::string block = section + ".params." + sel.name;
  std::string errors;
  for (const auto& [name, value] : sel.given) {
    try {
      reg.resolve_params(*info, Params({{name, value.first}}));
    } catch (const Error& e) {
      errors += (errors.empty() ? "" : "\n") + located(value.second, block + "." + name, e.what());
    }
  }
  // Inherited defaults (the top-level `hardware:`) apply to a plugin that
  // declares the parameter, where its own block does not set it.
  Params given = sel.given_params();
  for (const auto& [name, value] : sel.inherited) {
    if (sel.given.count(name) != 0) continue;
    const bool declared = std::any_of(info->params.begin(), info->params.end(),
                                      [&, &n = name](const ParamSpec& s) { return s.name == n; });
    if (!declared) continue;
    try {
      reg.resolve_params(*info, Params({{name, value.first}}));
      given.set(name, value.first);
    } catch (const Error& e) {
      errors += (errors.empty() ? "" : "\n") + located(value.second, name, section + " '" + sel.name + "': " + e.what());
    }
  }
  if (!errors.empty()) throw Error(errors);
  try {
    return reg.resolve_params(*info, given);
  } catch (const Error& e) {
    throw Error(located(sel.params_loc, block, e.what()));
  }
}

Problem make_problem(const Config& cfg) {
  RangeMask mask;
  std::shared_ptr<const IndexMask> index;  // index kinds (docs/masks.md)
  try {
    if (is_index_kind(cfg.mask.kind))
      index = std::make_shared<const IndexMask>(make_index_mask(cfg.mask, cfg.seqlen()));
    else
      mask = make_mask(cfg.mask, cfg.seqlen());
  } catch (const Error& e) {
    throw Error(located(cfg.mask_loc, "problem.mask", e.what()));
  }
  try {
    // make_index_mask validated the entries: not a second pass over them.
    Problem p = index ? make_index_problem(std::move(index), cfg.cp_size, cfg.heads, cfg.grid, /*validated=*/true)
                      : Problem::make(std::move(mask), cfg.cp_size, cfg.heads, cfg.grid);
    p.set_layout(cfg.layout, cfg.host_ranges);
    p.validate();
    return p;
  } catch (const Error& e) {
    throw Error(located(cfg.problem_loc, "problem", e.what()));
  }
}

}  // namespace cpsched
