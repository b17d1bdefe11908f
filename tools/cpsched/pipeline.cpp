#include "pipeline.hpp"

#include <chrono>

#include "cpsched/error.hpp"

namespace cpsched::cli {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void scan_plugins(Registry& reg, const Config* cfg, const std::vector<std::string>& extra_dirs) {
  reg.scan(Registry::default_plugin_dir());
  for (const auto& d : Registry::env_plugin_dirs()) reg.scan(d);
  if (cfg != nullptr)
    for (const auto& d : cfg->plugin_paths) reg.scan(d);
  for (const auto& d : extra_dirs) reg.scan(d);
}

Solved solve(const Config& cfg, const Registry& reg) {
  Solved s;
  s.solver_params = resolve_selection(reg, static_cast<int>(PluginKind::solver), cfg.solver);
  const Params cost_params = resolve_selection(reg, static_cast<int>(PluginKind::cost_model), cfg.cost_model);
  auto solver = reg.make_solver(cfg.solver.name, s.solver_params);
  auto cost = reg.make_cost_model(cfg.cost_model.name, cost_params);
  s.problem = std::make_shared<const Problem>(make_problem(cfg));

  auto t0 = std::chrono::steady_clock::now();
  s.grid = std::make_shared<const TaskGrid>(s.problem);
  s.grid_ms = ms_since(t0);

  t0 = std::chrono::steady_clock::now();
  s.assignment = solver->solve(SolveInput{s.grid, cost.get()});
  s.solve_ms = ms_since(t0);
  s.assignment.validate();

  t0 = std::chrono::steady_clock::now();
  s.metrics = compute_metrics(s.assignment);
  s.metrics_ms = ms_since(t0);
  return s;
}

}  // namespace cpsched::cli
