#include "commands/session_run.hpp"

namespace cpsched::cli {

SessionRun solve_with_session(const Config& cfg, const std::vector<std::string>& extra_plugin_dirs) {
  SessionRun r;
  r.registry = std::make_shared<Registry>();
  scan_plugins(*r.registry, &cfg, extra_plugin_dirs);
  // make_problem reports mask errors at their place in the config.
  auto problem = std::make_shared<const Problem>(make_problem(cfg));
  r.session = std::make_unique<Session>(cfg, r.registry);
  const CachedPlan& res = r.session->solve(std::move(problem));
  Solved& s = r.solved;
  s.assignment = *res.assignment;
  s.grid = res.assignment->grid;
  s.problem = s.grid->problem_ptr();
  s.solver_params = r.session->solver_params();
  s.metrics = res.metrics;
  s.solve_ms = res.solve_ms;
  r.plan_ms = res.plan_ms;
  return r;
}

}  // namespace cpsched::cli
