#include "cpsched/search/members.hpp"

#include <filesystem>

#include <cpsched/error.hpp>

namespace cpsched::search {

namespace {

// "static:chunk_tokens=2048+x=1" -> plugin "static" with those parameters.
std::string plugin_of(const std::string& spec) { return spec.substr(0, spec.find(':')); }

Params params_of(const std::string& spec, const PluginInfo& info) {
  Params given;
  const auto colon = spec.find(':');
  std::string rest = colon == std::string::npos ? "" : spec.substr(colon + 1);
  while (!rest.empty()) {
    const auto plus = rest.find('+');
    const std::string kv = rest.substr(0, plus);
    rest = plus == std::string::npos ? "" : rest.substr(plus + 1);
    const auto eq = kv.find('=');
    if (eq == std::string::npos) throw Error("member '" + spec + "': parameter '" + kv + "' needs name=value");
    const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    const ParamSpec* ps = nullptr;
    for (const ParamSpec& p : info.params)
      if (p.name == k) ps = &p;
    if (ps == nullptr) throw Error("member '" + spec + "': " + info.name + " has no parameter '" + k + "'");
    ParamValue value;
    if (!parse_param(v, ps->type, value))
      throw Error("member '" + spec + "': '" + v + "' is not a valid " + std::string(to_string(ps->type)) + " for " + k);
    given.set(k, value);
  }
  return given;
}

}  // namespace

Solver* MemberSolvers::get(const std::string& spec, std::string& why) {
  const std::string name = plugin_of(spec);
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
    Params given = params_of(spec, info);
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
  std::lock_guard<std::mutex> lock(mutex_);
  Solver* s = get(name, why);
  if (s == nullptr) return std::nullopt;
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
