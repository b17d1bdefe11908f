#pragma once
// Small helpers several unit tests share.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cpsched/base/error.hpp"
#include "cpsched/hardware/kernel_model.hpp"
#include "cpsched/hardware/task_kernel.hpp"
#include "cpsched/plugin/registry.hpp"
#include "cpsched/problem/task_grid.hpp"

namespace cpsched::test {

// The message of the cpsched::Error that f throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The build's plugins, scanned once. It lives to the end of the process:
// solvers made from it keep their libraries loaded.
inline Registry& build_registry() {
  static Registry* reg = [] {
    auto* r = new Registry;
    r->scan(CPSCHED_PLUGIN_BUILD_DIR);
    return r;
  }();
  return *reg;
}

// A registry of its own with the build's plugins, for a Session.
inline std::shared_ptr<Registry> new_build_registry() {
  auto reg = std::make_shared<Registry>();
  reg->scan(CPSCHED_PLUGIN_BUILD_DIR);
  return reg;
}

// The solver plugins of the build, by name (sorted).
inline std::vector<std::string> solver_names() {
  std::vector<std::string> v;
  for (const PluginInfo& p : build_registry().plugins())
    if (p.kind == PluginKind::solver) v.push_back(p.name);
  std::sort(v.begin(), v.end());
  return v;
}

// Parameters that keep a solver quick in tests: ilp proves optimality under
// a wall-clock limit, a short one will do (its plan, proven or not, must be
// valid all the same).
inline Params quick_params(const std::string& solver) {
  Params p;
  if (solver == "ilp") p.set("time_limit_s", 0.2);
  return p;
}

// Per rank, the tiles of tile_q x tile_k that its tasks' args touch (the
// args the plan builder makes, task_kernel_args), task t on rank_of(t).
inline std::vector<std::int64_t> rank_tiles(const TaskGrid& g, const std::function<Rank(TaskId)>& rank_of, int tile_q,
                                            int tile_k) {
  std::vector<std::int64_t> load(static_cast<std::size_t>(g.cp_size()), 0);
  std::vector<KernelArg> args;
  for (TaskId t = 0; t < g.num_tasks(); ++t) {
    task_kernel_args(g, t, args);
    for (const KernelArg& a : args)
      load[static_cast<std::size_t>(rank_of(t))] +=
          tiles_touched(static_cast<MaskType>(static_cast<int>(a.form)), a.q_len, a.k_len, tile_q, tile_k);
  }
  return load;
}

}  // namespace cpsched::test
