// Plugin discovery and loading (docs/design.md#plugins).
#include "cpsched/plugin/registry.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <deque>
#include <cstdlib>
#include <string_view>
#include <system_error>
#include <type_traits>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include "cpsched/base/error.hpp"
#include "cpsched/plugin/cost_model.hpp"
#include "cpsched/hardware/profile.hpp"
#include "plugin/elf_inspect.hpp"
#include "plugin/descriptor.hpp"
#include "plugin/objects.hpp"

namespace cpsched {

namespace fs = std::filesystem;
namespace dll = boost::dll;

std::string_view to_string(PluginKind k) {
  switch (k) {
    case PluginKind::solver: return "solver";
    case PluginKind::cost_model: return "cost_model";
    case PluginKind::executor: return "executor";
  }
  return "unknown";
}

namespace {

// resolve_params compares a value's variant index with its declared type.
static_assert(std::is_same_v<std::variant_alternative_t<int(ParamType::boolean), ParamValue>, bool>);
static_assert(std::is_same_v<std::variant_alternative_t<int(ParamType::integer), ParamValue>, std::int64_t>);
static_assert(std::is_same_v<std::variant_alternative_t<int(ParamType::real), ParamValue>, double>);
static_assert(std::is_same_v<std::variant_alternative_t<int(ParamType::string), ParamValue>, std::string>);

constexpr const char* kDescriptorSymbol = CPSCHED_STR(CPSCHED_PLUGIN_SYMBOL);

// What scan() considers a plugin: lib<prefix><name>.so, as cpsched_add_plugin
// names them; any other file in a scanned folder is not ours and is left alone.
constexpr std::string_view kFilePrefix = "libcpsched_";
constexpr std::string_view kFileSuffix = ".so";

bool plugin_file_name(const std::string& f) {
  return f.size() > kFilePrefix.size() + kFileSuffix.size() && f.compare(0, kFilePrefix.size(), kFilePrefix) == 0 &&
         f.compare(f.size() - kFileSuffix.size(), kFileSuffix.size(), kFileSuffix) == 0;
}

std::string quoted(const ParamValue& v) {
  return std::holds_alternative<std::string>(v) ? "\"" + format_param(v) + "\"" : format_param(v);
}

std::string known_params(const PluginInfo& info) {
  if (info.params.empty()) return "it takes no parameters";
  std::string s = "known parameters:";
  for (const ParamSpec& p : info.params) {
    s += "\n  " + p.name + " (" + std::string(to_string(p.type)) + ", default " +
         quoted(p.default_value) + ")";
    if (!p.doc.empty()) s += ": " + p.doc;
  }
  return s;
}

const char* value_type(const ParamValue& v) {
  static constexpr const char* names[] = {"bool", "int", "real", "string"};
  return names[v.index()];
}

// dlopen's own words (missing file, unresolved symbol, wrong ELF class, ...).
std::string dl_reason(const dll::fs::error_code& ec) {
  const char* why = ::dlerror();
  return why != nullptr ? std::string(why) : ec.message();
}

// The cost models every host has (plugin/cost_model.hpp): listed and made
// like plugins, with no file behind them.
std::unique_ptr<CostModel> make_builtin_cost_model(const std::string& name, const Params& params) {
  if (name == "area") return std::make_unique<AreaCostModel>();
  return std::make_unique<TimeCostModel>(resolve_hardware_profile(params.get_string("hardware")));
}

std::vector<PluginInfo> builtin_plugins() {
  PluginInfo area{"area", PluginKind::cost_model, "the seed's model: compute = area, transfer = tokens x heads", {}, {},
                  true};
  PluginInfo time{"time", PluginKind::cost_model,
                  "seconds on a hardware profile: compute = FLOPs / throughput, transfers = bytes / bandwidth of the "
                  "link class of (src, dst), forward and backward; the host prices whole plans on the same profile "
                  "with its timing model",
                  {ParamSpec{"hardware", ParamType::string, std::string(kDefaultHardwareProfile),
                             "hardware profile: a bundled name (h100_8x_nvlink, h200_8x_nvlink, cluster_8gpu_ib) or a "
                             "path to a profile YAML; the top-level `hardware:` key sets it"}},
                  {},
                  true};
  return {area, time};
}

}  // namespace

struct Registry::Impl {
  struct Entry {
    PluginInfo info;
    detail::PluginLib lib;  // empty for a built-in
  };
  // A deque, so that the PluginInfo references load() and find() hand out
  // stay valid while more plugins load; `infos` is the copy plugins() lists.
  std::deque<Entry> entries;
  std::vector<PluginInfo> infos;
  std::vector<PluginProblem> problems;
  std::vector<fs::path> scanned;

  const Entry& entry_of(const PluginInfo& info) const {
    for (const Entry& e : entries) {
      if (&e.info == &info) return e;
    }
    throw Error("plugin '" + info.name + "' does not belong to this registry");
  }
};

Registry::Registry() : impl_(std::make_unique<Impl>()) {
  for (PluginInfo& info : builtin_plugins()) {
    impl_->infos.push_back(info);
    impl_->entries.push_back({std::move(info), {}});
  }
}
Registry::~Registry() = default;

fs::path Registry::default_plugin_dir() {
  // Plugins live in <libdir>/cpsched/plugins beside libcpsched itself, in the
  // build tree and in any installation (lib, lib64, lib/x86_64-linux-gnu...).
  // The Python package (pip install .) carries libcpsched beside its module
  // and the plugins in plugins/ there (docs/python.md): used when the
  // installation's folder is absent and that one exists.
  const fs::path core_lib = dll::this_line_location().string();
  fs::path dir = core_lib.parent_path() / "cpsched" / "plugins";
  std::error_code ec;
  if (!fs::is_directory(dir, ec) && fs::is_directory(core_lib.parent_path() / "plugins", ec))
    dir = core_lib.parent_path() / "plugins";
  fs::path normal = fs::weakly_canonical(dir, ec);
  return ec ? dir.lexically_normal() : normal;
}

std::vector<fs::path> Registry::env_plugin_dirs() {
  std::vector<fs::path> dirs;
  const char* env = std::getenv("CPSCHED_PLUGIN_PATH");
  if (env == nullptr) return dirs;
  std::string_view rest(env);
  while (true) {
    const std::size_t colon = rest.find(':');
    const std::string_view part = rest.substr(0, colon);
    if (!part.empty()) dirs.emplace_back(part);
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  return dirs;
}

void Registry::scan_default_folders(const std::vector<fs::path>& extra) {
  scan(default_plugin_dir());
  for (const fs::path& d : env_plugin_dirs()) scan(d);
  for (const fs::path& d : extra) scan(d);
}

void Registry::scan(const fs::path& dir) {
  impl_->scanned.push_back(dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    impl_->problems.push_back({dir, "plugin folder '" + dir.string() + "' does not exist or is not a folder"});
    return;
  }
  std::vector<fs::path> files;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    // Not only regular files: a FIFO or a dangling link with a plugin's name is
    // reported by load(), not silently skipped.
    std::error_code type_ec;
    if (plugin_file_name(it->path().filename().string()) && !it->is_directory(type_ec)) files.push_back(it->path());
  }
  if (ec) {
    impl_->problems.push_back({dir, "cannot list plugin folder '" + dir.string() + "': " + ec.message()});
  }
  std::sort(files.begin(), files.end());  // load order decides which duplicate wins
  for (const fs::path& f : files) {
    try {
      load(f);
    } catch (const Error& e) {
      impl_->problems.push_back({f, e.what()});
    }
  }
}

const PluginInfo& Registry::load(const fs::path& file) {
  std::error_code fec;
  const fs::path path = fs::weakly_canonical(fs::absolute(file, fec), fec);
  const std::string where = detail::plugin_file_label(path.empty() ? file : path);
  if (fec || !fs::exists(path, fec)) throw Error(where + ": no such file");
  if (!fs::is_regular_file(path, fec)) throw Error(where + ": not a regular file");
  for (const Impl::Entry& e : impl_->entries) {
    if (e.info.file == path) return e.info;  // same file through another folder
  }
  try {
    // Before dlopen: a damaged file must not crash us (SIGBUS on a truncated
    // copy) and a foreign library's initialisers must not run.
    detail::inspect_plugin_file(path, where, kDescriptorSymbol);
    auto lib = std::make_shared<dll::shared_library>();
    dll::fs::error_code ec;
    ::dlerror();  // so that dl_reason reports this load's failure
    lib->load(path.string(), dll::load_mode::rtld_now | dll::load_mode::rtld_local, ec);
    if (ec) throw Error(where + ": cannot be loaded: " + dl_reason(ec));
    if (!lib->has(kDescriptorSymbol)) {
      throw Error(where + ": exports no '" + std::string(kDescriptorSymbol) +
                  "' (not a cpsched plugin? define it with CPSCHED_SOLVER_PLUGIN or a sibling macro)");
    }
    // The exported symbol is Boost.DLL's alias: a pointer to the descriptor.
    // Both are checked to lie inside the library before they are read.
    const detail::LoadedImage image = detail::LoadedImage::of(lib->native());
    if (image.empty()) throw Error(where + ": cannot locate the loaded library's segments");
    const void* alias = ::dlsym(lib->native(), kDescriptorSymbol);
    if (!image.holds(alias, sizeof(const void*))) {
      throw Error(where + ": its '" + std::string(kDescriptorSymbol) + "' is not data of the plugin itself");
    }
    const void* desc_addr = *static_cast<const void* const*>(alias);
    PluginInfo info = detail::read_descriptor(desc_addr, image, path);
    const auto* desc = static_cast<const cpsched_plugin_descriptor_t*>(desc_addr);
    for (const PluginInfo& other : impl_->infos) {
      if (other.kind == info.kind && other.name == info.name) {
        throw Error(where + ": " + std::string(to_string(info.kind)) + " name '" + info.name + "' is already taken " +
                    (other.built_in ? std::string("by a built-in (a stale plugin file of an older build?)")
                                    : "by plugin file '" + other.file.string() + "'"));
      }
    }
    detail::PluginLib handle{std::move(lib), desc,
                             "plugin '" + info.name + "' (" + path.string() + ")"};
    impl_->infos.push_back(info);
    impl_->entries.push_back({std::move(info), std::move(handle)});
    return impl_->entries.back().info;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(where + ": " + e.what());
  }
}

const std::vector<PluginInfo>& Registry::plugins() const { return impl_->infos; }
const std::vector<PluginProblem>& Registry::problems() const { return impl_->problems; }

const PluginInfo& Registry::find(PluginKind kind, const std::string& name) const {
  std::string known;
  for (const Impl::Entry& e : impl_->entries) {
    const PluginInfo& info = e.info;
    if (info.kind != kind) continue;
    if (info.name == name) return info;
    if (!known.empty()) known += ", ";
    known += info.name;
  }
  std::string msg;
  bool file_failed = false;
  // The file that should have provided it failed to load: its fault is the answer.
  const std::string expected_file = std::string(kFilePrefix) + name + std::string(kFileSuffix);
  for (const PluginProblem& p : impl_->problems) {
    if (p.file.filename() == expected_file) {
      msg = std::string(to_string(kind)) + " plugin '" + name + "' did not load: " + p.message + "\n";
      file_failed = true;
      break;
    }
  }
  msg += "no " + std::string(to_string(kind)) + " plugin named '" + name + "'; known " +
         std::string(to_string(kind)) + " plugins: " + (known.empty() ? "(none)" : known);
  if (!impl_->scanned.empty()) {
    msg += "\nsearched:";
    for (const fs::path& d : impl_->scanned) {
      msg += ' ';
      msg += d.string();
    }
  }
  // A plugin that failed to load is the likeliest reason for a missing name.
  for (const PluginProblem& p : impl_->problems) {
    msg += "\nrejected: ";
    msg += p.message;
  }
  if (file_failed) throw PluginError(msg);  // the plugin is broken, not the name asked for
  throw Error(msg);
}

Params Registry::resolve_params(const PluginInfo& info, const Params& given) const {
  const std::string who = std::string(to_string(info.kind)) + " '" + info.name + "'";
  Params out;
  for (const ParamSpec& p : info.params) out.set(p.name, p.default_value);
  for (const auto& [name, value] : given.values()) {
    const auto spec = std::find_if(info.params.begin(), info.params.end(),
                                   [&](const ParamSpec& p) { return p.name == name; });
    if (spec == info.params.end()) {
      throw Error(who + " has no parameter '" + name + "'; " + known_params(info));
    }
    if (spec->type == ParamType::real && std::holds_alternative<std::int64_t>(value)) {
      out.set(name, static_cast<double>(std::get<std::int64_t>(value)));
      continue;
    }
    if (value.index() != static_cast<std::size_t>(spec->type)) {
      throw Error("parameter '" + name + "' of " + who + " expects " +
                  std::string(to_string(spec->type)) + ", got " + value_type(value) + " " +
                  quoted(value) + "; " + known_params(info));
    }
    out.set(name, value);
  }
  return out;
}

std::unique_ptr<Solver> Registry::make_solver(const std::string& name, const Params& params) const {
  const PluginInfo& info = find(PluginKind::solver, name);
  return detail::make_solver_object(impl_->entry_of(info).lib, resolve_params(info, params));
}

std::unique_ptr<CostModel> Registry::make_cost_model(const std::string& name,
                                                     const Params& params) const {
  const PluginInfo& info = find(PluginKind::cost_model, name);
  if (info.built_in) return make_builtin_cost_model(name, resolve_params(info, params));
  return detail::make_cost_model_object(impl_->entry_of(info).lib,
                                        resolve_params(info, params));
}

std::unique_ptr<Executor> Registry::make_executor(const std::string& name,
                                                  const Params& params) const {
  const PluginInfo& info = find(PluginKind::executor, name);
  return detail::make_executor_object(impl_->entry_of(info).lib,
                                      resolve_params(info, params));
}

std::unique_ptr<Solver> RegistrySolvers::make(const std::string& spec, const Params& fallback) const {
  const std::string name = spec_plugin(spec);
  const PluginInfo& info = registry_.find(PluginKind::solver, name);
  Params given = spec_params(spec, info.params);
  for (const ParamSpec& ps : info.params)
    if (!given.has(ps.name) && fallback.has(ps.name)) given.set(ps.name, fallback.values().at(ps.name));
  return registry_.make_solver(name, registry_.resolve_params(info, given));
}

}  // namespace cpsched
