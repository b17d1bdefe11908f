#pragma once
// Host side of the plugin contract: discovers plugin shared objects, checks
// their descriptor, and makes objects that keep their library loaded.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cpsched/plugin/cost_model.hpp"
#include "cpsched/plugin/executor.hpp"
#include "cpsched/plugin/params.hpp"
#include "cpsched/plugin/solver.hpp"

namespace cpsched {

enum class PluginKind : int { solver = 1, cost_model = 2, executor = 3 };
std::string_view to_string(PluginKind k);

struct PluginInfo {
  std::string name;
  PluginKind kind = PluginKind::solver;
  std::string doc;
  std::vector<ParamSpec> params;
  std::filesystem::path file;  // empty for a built-in
  bool built_in = false;       // part of libcpsched (the `area` and `time` cost models), no file
};

// A plugin file that could not be registered, and why (message names the file).
struct PluginProblem {
  std::filesystem::path file;
  std::string message;
};

class Registry {
 public:
  // Starts with the built-in plugins (the `area` and `time` cost models).
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The build's / installation's plugin folder: <folder of libcpsched>/cpsched/plugins.
  static std::filesystem::path default_plugin_dir();
  // Folders from CPSCHED_PLUGIN_PATH (colon separated).
  static std::vector<std::filesystem::path> env_plugin_dirs();

  // Scans the default folder, CPSCHED_PLUGIN_PATH's, then `extra` (in that
  // order: the first file of a name wins). What every host does first.
  void scan_default_folders(const std::vector<std::filesystem::path>& extra = {});
  // Loads every plugin file in `dir`: lib<prefix><name>.so (libcpsched_*.so, as
  // cpsched_add_plugin names them); other files are ignored. Files that fail
  // are kept as problems and the scan goes on.
  void scan(const std::filesystem::path& dir);
  // Loads one file (any name); throws cpsched::Error naming the file on any
  // fault. Before dlopen the file is inspected (a regular file, an ELF shared
  // object of this host, segments and sections inside the file, the
  // descriptor symbol exported), so a damaged or foreign file is an error,
  // never a crash, and runs no initialisers. After it: wrong ABI, wrong build
  // signature, descriptor fields outside the library or over their bounds,
  // duplicate name, bad parameter schema.
  const PluginInfo& load(const std::filesystem::path& file);

  const std::vector<PluginInfo>& plugins() const;
  const std::vector<PluginProblem>& problems() const;
  // Throws cpsched::Error listing the known plugins of that kind; when the
  // file named after it (libcpsched_<name>.so) failed to load, its fault first.
  const PluginInfo& find(PluginKind kind, const std::string& name) const;

  // Values for every declared parameter: defaults overlaid with `given`.
  // Unknown names and wrong types are errors that list the known parameters.
  Params resolve_params(const PluginInfo& info, const Params& given) const;

  // Objects keep their plugin library loaded while alive. `params` must come
  // from resolve_params. Factory failures become cpsched::Error naming the plugin.
  std::unique_ptr<Solver> make_solver(const std::string& name, const Params& params) const;
  std::unique_ptr<CostModel> make_cost_model(const std::string& name, const Params& params) const;
  std::unique_ptr<Executor> make_executor(const std::string& name, const Params& params) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Solver plugins of a registry by spec (SolverFactory, plugin/solver.hpp):
// what the host offers a solver for its members.
class RegistrySolvers final : public SolverFactory {
 public:
  explicit RegistrySolvers(const Registry& registry) : registry_(registry) {}
  std::unique_ptr<Solver> make(const std::string& spec, const Params& fallback) const override;

 private:
  const Registry& registry_;
};

}  // namespace cpsched
