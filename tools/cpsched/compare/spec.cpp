#include "compare/spec.hpp"

#include <algorithm>
#include <fmt/format.h>
#include <set>
#include <yaml-cpp/yaml.h>

#include "cpsched/base/error.hpp"
#include "cpsched/io/input_file.hpp"
#include "cpsched/plugin/registry.hpp"

namespace cpsched::cli {

namespace {

// Errors name the key path and where its value came from: the `--set` that
// gave it, else its line in the file (the section's text is re-parsed here,
// so positions inside it would not match the file), else the section.
class Reader {
 public:
  Reader(const Config& cfg, const std::vector<std::string>& overrides) : cfg_(cfg), overrides_(overrides) {
    try {
      // The config was read once already (load_config); bounded and regular-file only, as there.
      if (!cfg.file.empty() && non_regular_kind(cfg.file).empty() && std::filesystem::exists(cfg.file))
        file_root_ = YAML::Load(read_input_file(cfg.file, 16u << 20, "configuration file"));
    } catch (const YAML::Exception&) {
      // Not a file (parse_config from text): the section's location will do.
    } catch (const Error&) {
      // Gone or changed since it was loaded: the section's location will do.
    }
  }

  [[noreturn]] void fail(const std::string& key, const std::string& msg) const {
    const std::string where = location(key);
    throw Error(fmt::format("{}{}compare{}{}: {}", where, where.empty() ? "" : ": ", key.empty() ? "" : ".", key, msg));
  }

  std::string location(const std::string& key) const {
    const std::string top = key.substr(0, key.find_first_of(".["));
    const std::string path = "compare." + top;
    std::string from_set;
    for (const auto& o : overrides_) {
      const std::string p = o.substr(0, o.find('='));
      if (p == "compare" || p == path || p.rfind(path + ".", 0) == 0) from_set = "--set " + p;
    }
    if (!from_set.empty()) return from_set;
    if (file_root_.IsMap() && file_root_["compare"].IsMap() && !top.empty()) {
      const YAML::Node n = file_root_["compare"][top];
      if (n.IsDefined() && n.Mark().line >= 0)
        return fmt::format("{}:{}:{}", cfg_.file.string(), n.Mark().line + 1, n.Mark().column + 1);
    }
    return cfg_.compare_loc.str();
  }

  int to_int(const YAML::Node& n, const std::string& key, int min) const {
    if (!n.IsScalar()) fail(key, "expected an integer, got " + describe(n));
    int v = 0;
    try {
      v = n.as<int>();
    } catch (const YAML::Exception&) {
      fail(key, fmt::format("expected an integer, got '{}'", n.Scalar()));
    }
    if (v < min) fail(key, fmt::format("must be >= {}, got {}", min, v));
    return v;
  }

  std::string to_string(const YAML::Node& n, const std::string& key) const {
    if (!n.IsScalar()) fail(key, "expected a name, got " + describe(n));
    return n.Scalar();
  }

  // A list, or one scalar standing for a list of one.
  std::vector<YAML::Node> list(const YAML::Node& n, const std::string& key) const {
    std::vector<YAML::Node> out;
    if (n.IsSequence()) {
      for (const auto& e : n) out.push_back(e);
      if (out.empty()) fail(key, "the list is empty");
    } else if (n.IsScalar() || n.IsMap()) {
      out.push_back(n);
    } else {
      fail(key, "expected a list, got " + describe(n));
    }
    return out;
  }

  static std::string describe(const YAML::Node& n) {
    if (n.IsSequence()) return "a list";
    if (n.IsMap()) return "a map";
    if (n.IsNull()) return "nothing";
    return "'" + n.Scalar() + "'";
  }

 private:
  const Config& cfg_;
  const std::vector<std::string>& overrides_;
  YAML::Node file_root_;
};

const std::vector<std::string> kKeys = {"solvers", "masks",   "cp_sizes",  "packs",  "heads",
                                        "stages",  "repeats", "reference", "timing", "max_cp_size",
                                        "repeats_per_solver", "hardware", "layouts", "uses", "rank_path"};

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

template <class T>
void check_unique(const Reader& r, const std::vector<T>& v, const std::string& key) {
  std::set<T> seen;
  for (const auto& x : v)
    if (!seen.insert(x).second) r.fail(key, fmt::format("'{}' is listed twice", x));
}

// Returns whether `timing.hardware` was given.
bool read_timing(const Reader& r, const YAML::Node& n, CompareSpec& spec) {
  if (n.IsNull() || (n.IsScalar() && (n.Scalar() == "none" || n.Scalar() == "false" || n.Scalar() == "off"))) {
    spec.timing = false;
    return false;
  }
  if (!n.IsMap()) r.fail("timing", "expected {executor: sim, hardware: NAME} or 'none', got " + Reader::describe(n));
  bool hardware = false;
  for (const auto& kv : n) {
    const std::string k = kv.first.Scalar();
    if (k == "executor") {
      spec.timing_executor = r.to_string(kv.second, "timing.executor");
    } else if (k == "hardware") {
      spec.hardware = {r.to_string(kv.second, "timing.hardware")};
      hardware = true;
    } else {
      r.fail("timing." + k, "unknown key; known: executor, hardware");
    }
  }
  return hardware;
}

HeadConfig read_heads(const Reader& r, const YAML::Node& n, const std::string& key, const Heads& base) {
  if (!n.IsMap()) r.fail(key, "expected {q: N, kv: N} (dim optional), got " + Reader::describe(n));
  HeadConfig h{base.q, base.kv, base.dim};
  for (const auto& kv : n) {
    const std::string k = kv.first.Scalar();
    if (k == "q")
      h.q = r.to_int(kv.second, key + ".q", 1);
    else if (k == "kv")
      h.kv = r.to_int(kv.second, key + ".kv", 1);
    else if (k == "dim")
      h.dim = r.to_int(kv.second, key + ".dim", 1);
    else
      r.fail(key + "." + k, "unknown key; known: q, kv, dim");
  }
  if (h.q % h.kv != 0) r.fail(key, fmt::format("q = {} heads is not a multiple of kv = {}", h.q, h.kv));
  return h;
}

// compare.hardware (a list or one name) or compare.timing.hardware (one name),
// not both; every profile is loaded here so that a bad name fails before the sweep.
void read_hardware(const Reader& r, const YAML::Node& n, bool timing_hardware, const Config& cfg,
                   const Registry& reg, CompareSpec& spec) {
  const bool given = n.IsDefined() && !n.IsNull();
  if (given && timing_hardware)
    r.fail("hardware", "compare.hardware and compare.timing.hardware both give the hardware; keep one "
                       "(compare.hardware takes a list, compare.timing.hardware one profile)");
  if (given) {
    spec.hardware.clear();
    for (const auto& e : r.list(n, "hardware")) spec.hardware.push_back(r.to_string(e, "hardware"));
    check_unique(r, spec.hardware, "hardware");
  }
  // Neither given: the config's top-level `hardware:` (already checked, its
  // path already relative to the config's folder), else the bundled default.
  const bool from_top = !given && !timing_hardware && !cfg.hardware.empty();
  if (from_top) spec.hardware = {cfg.hardware};
  for (const auto& p : reg.plugins())
    if (p.kind == PluginKind::cost_model && p.name == cfg.cost_model.name)
      for (const auto& ps : p.params) spec.cost_model_hardware = spec.cost_model_hardware || ps.name == "hardware";
  if (!spec.timing && !spec.cost_model_hardware) {
    if (given)
      r.fail("hardware", fmt::format("has no effect: compare.timing is none and cost model '{}' has no `hardware` "
                                     "parameter; remove compare.hardware or turn timing on",
                                     cfg.cost_model.name));
    spec.hardware.clear();
    return;
  }
  const std::string key = timing_hardware ? "timing.hardware" : "hardware";
  for (const auto& name : spec.hardware) {
    std::string resolved = name;
    const bool is_path = name.find('/') != std::string::npos || name.ends_with(".yaml") || name.ends_with(".yml");
    if (is_path && !from_top && std::filesystem::path(name).is_relative() && !cfg.file.empty())
      resolved = (cfg.file.parent_path() / name).lexically_normal().string();
    spec.hardware_specs.push_back(resolved);
    try {
      spec.hardware_profiles.push_back(resolve_hardware_profile(resolved));
    } catch (const Error& e) {
      r.fail(key, e.what());
    }
  }
}

}  // namespace

bool mask_uses_packs(const MaskSpec& spec, MaskKind kind) {
  switch (kind) {
    case MaskKind::full:
    case MaskKind::causal:
    case MaskKind::slices:
      return false;
    default:
      return spec.lengths.empty() && !spec.histogram.bins.empty();
  }
}

CompareSpec read_compare_spec(const Config& cfg, const Registry& reg, const std::vector<std::string>& overrides) {
  const Reader r(cfg, overrides);
  CompareSpec spec;
  YAML::Node root;
  if (!cfg.compare_yaml.empty()) root = YAML::Load(cfg.compare_yaml);
  if (root.IsDefined() && !root.IsNull() && !root.IsMap())
    r.fail("", "expected a map with keys " + join(kKeys) + ", got " + Reader::describe(root));
  auto get = [&](const std::string& key) -> YAML::Node {
    if (!root.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    return root[key];
  };
  if (root.IsMap())
    for (const auto& kv : root)
      if (std::find(kKeys.begin(), kKeys.end(), kv.first.Scalar()) == kKeys.end())
        r.fail(kv.first.Scalar(), "unknown key; known: " + join(kKeys));

  // Solvers: every one must be a solver plugin that was found.
  std::vector<std::string> found;
  for (const auto& p : reg.plugins())
    if (p.kind == PluginKind::solver) found.push_back(p.name);
  std::sort(found.begin(), found.end());
  if (const auto n = get("solvers"); n.IsDefined() && !n.IsNull()) {
    for (const auto& e : r.list(n, "solvers")) {
      const std::string name = r.to_string(e, "solvers");
      if (std::find(found.begin(), found.end(), name) == found.end())
        r.fail("solvers", fmt::format("no solver plugin '{}' was found (found: {})", name, join(found)));
      spec.solvers.push_back(name);
    }
  } else {
    spec.solvers = found;
  }
  if (spec.solvers.empty()) r.fail("solvers", "no solver plugin was found: nothing to compare");
  check_unique(r, spec.solvers, "solvers");

  if (const auto n = get("masks"); n.IsDefined() && !n.IsNull()) {
    for (const auto& e : r.list(n, "masks")) {
      const std::string name = r.to_string(e, "masks");
      MaskKind k{};
      if (!parse_mask_kind(name, k)) {
        std::vector<std::string> known = mask_kind_names();
        for (const std::string& x : index_mask_kind_names()) known.push_back(x);  // the sparse kinds too
        r.fail("masks", fmt::format("unknown mask kind '{}'; known: {}", name, join(known)));
      }
      spec.masks.push_back(k);
    }
  } else {
    spec.masks = {cfg.mask.kind};
  }
  {
    std::vector<std::string> names;
    for (auto k : spec.masks) names.emplace_back(to_string(k));
    check_unique(r, names, "masks");
  }

  if (const auto n = get("cp_sizes"); n.IsDefined() && !n.IsNull()) {
    for (const auto& e : r.list(n, "cp_sizes")) spec.cp_sizes.push_back(r.to_int(e, "cp_sizes", 1));
  } else {
    spec.cp_sizes = {cfg.cp_size};
  }
  check_unique(r, spec.cp_sizes, "cp_sizes");

  if (const auto n = get("packs"); n.IsDefined() && !n.IsNull()) {
    if (n.IsScalar()) {
      const int count = r.to_int(n, "packs", 1);
      for (int i = 0; i < count; ++i) spec.packs.push_back(i);
    } else {
      for (const auto& e : r.list(n, "packs")) spec.packs.push_back(r.to_int(e, "packs", 0));
    }
  } else {
    spec.packs = {cfg.mask.pack};
  }
  check_unique(r, spec.packs, "packs");

  if (const auto n = get("heads"); n.IsDefined() && !n.IsNull()) {
    const auto items = r.list(n, "heads");
    for (std::size_t i = 0; i < items.size(); ++i)
      spec.heads.push_back(read_heads(r, items[i], fmt::format("heads[{}]", i), cfg.heads));
  } else {
    spec.heads = {HeadConfig{cfg.heads.q, cfg.heads.kv, cfg.heads.dim}};
  }

  if (const auto n = get("stages"); n.IsDefined() && !n.IsNull()) {
    // `auto` (0): the solver chooses (plan.stages: auto); only as the one entry,
    // since one solve then serves the row.
    for (const auto& e : r.list(n, "stages"))
      spec.stages.push_back(e.IsScalar() && e.Scalar() == "auto" ? 0 : r.to_int(e, "stages", 1));
    if (spec.stages.size() > 1 && std::find(spec.stages.begin(), spec.stages.end(), 0) != spec.stages.end())
      r.fail("stages", "auto must be the only entry (the solver's choice serves the whole row)");
  } else {
    spec.stages = {cfg.plan.stages};
  }
  check_unique(r, spec.stages, "stages");
  spec.relay = cfg.plan.relay;

  if (const auto n = get("layouts"); n.IsDefined() && !n.IsNull()) {
    for (const auto& e : r.list(n, "layouts")) {
      const std::string v = r.to_string(e, "layouts");
      if (v == "fixed") spec.layouts.push_back(Layout::fixed);
      else if (v == "planned") spec.layouts.push_back(Layout::planned);
      else r.fail("layouts", fmt::format("'{}' is not a layout (fixed or planned)", v));
    }
  } else {
    spec.layouts = {cfg.layout};
  }
  {
    std::vector<std::string> names;
    for (Layout l : spec.layouts) names.emplace_back(to_string(l));
    check_unique(r, names, "layouts");
  }
  if (const auto n = get("uses"); n.IsDefined() && !n.IsNull()) {
    for (const auto& e : r.list(n, "uses"))
      spec.uses.push_back(e.IsScalar() && e.Scalar() == "ahead" ? PlanUses::ahead() : PlanUses{r.to_int(e, "uses", 1)});
  } else {
    spec.uses = {cfg.uses};
  }
  {
    std::vector<std::string> names;
    for (const auto& u : spec.uses) names.push_back(u ? u->str() : "by layout");
    check_unique(r, names, "uses");
  }
  if (const auto n = get("rank_path"); n.IsDefined() && !n.IsNull()) {
    if (!n.IsScalar() || (n.Scalar() != "true" && n.Scalar() != "false"))
      r.fail("rank_path", "expected true or false, got " + Reader::describe(n));
    spec.rank_path = n.Scalar() == "true";
  }

  if (const auto n = get("repeats"); n.IsDefined() && !n.IsNull()) spec.repeats = r.to_int(n, "repeats", 1);
  // An explicit baseline must exist; the default one may be missing (its
  // columns then stay empty and the tool says so).
  if (const auto n = get("reference"); n.IsDefined() && !n.IsNull()) {
    spec.reference = r.to_string(n, "reference");
    if (std::find(found.begin(), found.end(), spec.reference) == found.end())
      r.fail("reference", fmt::format("no solver plugin '{}' was found for the baseline placement (found: {})",
                                      spec.reference, join(found)));
  } else if (std::find(found.begin(), found.end(), spec.reference) == found.end()) {
    spec.reference.clear();
  }
  bool timing_hardware = false;
  if (const auto n = get("timing"); n.IsDefined()) {
    timing_hardware = read_timing(r, n, spec);
    // An executor named here must exist: a typo would otherwise only leave
    // the timing columns empty, with a note, and exit 0.
    if (spec.timing && n.IsMap() && n["executor"].IsDefined()) {
      std::vector<std::string> executors;
      for (const auto& p : reg.plugins())
        if (p.kind == PluginKind::executor) executors.push_back(p.name);
      if (std::find(executors.begin(), executors.end(), spec.timing_executor) == executors.end())
        r.fail("timing.executor", fmt::format("no executor plugin '{}' was found (found: {})", spec.timing_executor,
                                              executors.empty() ? std::string("none") : join(executors)));
    }
  }
  read_hardware(r, get("hardware"), timing_hardware, cfg, reg, spec);
  if (const auto n = get("max_cp_size"); n.IsDefined() && !n.IsNull()) {
    if (!n.IsMap()) r.fail("max_cp_size", "expected a map {solver: P}, got " + Reader::describe(n));
    for (const auto& kv : n) {
      const std::string name = kv.first.Scalar();
      if (std::find(spec.solvers.begin(), spec.solvers.end(), name) == spec.solvers.end())
        r.fail("max_cp_size." + name, fmt::format("'{}' is not among the compared solvers ({})", name, join(spec.solvers)));
      spec.max_cp_size[name] = r.to_int(kv.second, "max_cp_size." + name, 1);
    }
  }
  if (const auto n = get("repeats_per_solver"); n.IsDefined() && !n.IsNull()) {
    if (!n.IsMap()) r.fail("repeats_per_solver", "expected a map {solver: N}, got " + Reader::describe(n));
    for (const auto& kv : n) {
      const std::string name = kv.first.Scalar();
      if (std::find(spec.solvers.begin(), spec.solvers.end(), name) == spec.solvers.end())
        r.fail("repeats_per_solver." + name,
               fmt::format("'{}' is not among the compared solvers ({})", name, join(spec.solvers)));
      spec.repeats_per_solver[name] = r.to_int(kv.second, "repeats_per_solver." + name, 1);
    }
  }
  return spec;
}

int solver_repeats(const CompareSpec& spec, const std::string& solver, const Params& solver_params) {
  if (const auto it = spec.repeats_per_solver.find(solver); it != spec.repeats_per_solver.end()) return it->second;
  return solver_params.has("time_limit_s") ? 1 : spec.repeats;
}

}  // namespace cpsched::cli
