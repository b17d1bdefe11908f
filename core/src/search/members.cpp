#include "cpsched/search/members.hpp"

#include <filesystem>

#include <cpsched/base/error.hpp>

namespace cpsched::search {


Solver* MemberSolvers::get(const std::string& spec, std::string& why) {
  const std::string name = spec_plugin(spec);
  if (auto it = solvers_.find(spec); it != solvers_.end()) return it->second.get();
  if (auto it = missing_.find(spec); it != missing_.end()) {
    why = it->second;
    return nullptr;
  }
  try {
    if (!registry_) registry_ = std::make_unique<Registry>();
    std::vector<std::filesystem::path> dirs = {Registry::default_plugin_dir()};
    for (const auto& d : Registry::env_plugin_dirs()) dirs.push_back(d);
    const std::string file = "libcpsched_" + name + ".so";
    bool loaded = false;
    for (const auto& d : dirs) {
      std::error_code ec;
      if (!std::filesystem::is_regular_file(d / file, ec)) continue;
      registry_->load(d / file);
      loaded = true;
      break;
    }
    if (!loaded) throw Error("no " + file + " in the plugin folders");
    const PluginInfo& info = registry_->find(PluginKind::solver, name);
    Params given = spec_params(spec, info.params);
    // Members run single-threaded: the portfolio parallelises over its starts.
    for (const ParamSpec& ps : info.params)
      if (ps.name == "threads" && !given.has("threads")) given.set("threads", std::int64_t{1});
    solvers_[spec] = registry_->make_solver(name, registry_->resolve_params(info, given));
    return solvers_[spec].get();
  } catch (const std::exception& e) {
    missing_[spec] = e.what();
    why = e.what();
    return nullptr;
  }
}

std::optional<Assignment> MemberSolvers::solve(const std::string& name, const SolveInput& in, std::string& why) {
  Solver* s = nullptr;
  std::mutex* busy = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s = get(name, why);
    if (s == nullptr) return std::nullopt;
    busy = &busy_[name];  // (map nodes stay put)
  }
  std::lock_guard<std::mutex> lock(*busy);
  try {
    Assignment a = s->solve(in);
    a.validate();
    return a;
  } catch (const std::exception& e) {
    why = e.what();
    return std::nullopt;
  }
}

}  // namespace cpsched::search
