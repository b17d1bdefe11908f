#include <fmt/format.h>

#include "commands/commands.hpp"
#include "cpsched/io/atomic_file.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/plugin/registry.hpp"
#include "cpsched/problem/resources.hpp"
#include "commands/report.hpp"
#include "commands/session_run.hpp"

namespace po = boost::program_options;

namespace cpsched::cli {

int cmd_run(const Args& args) {
  ConfigOptions co;
  std::string svg;
  po::options_description desc("options");
  co.add_to(desc);
  desc.add_options()("svg", po::value(&svg), "write the executor's picture (per-rank timeline) to this SVG file");
  po::variables_map vm;
  if (!co.parse(args, "run", "Solves the config, builds the plan, executes it with the configured executor and reports.",
                desc, vm))
    return 0;
  const Config cfg = co.load();
  if (cfg.executor.name.empty()) throw Error(fmt::format("{}: no executor selected (executor.name)", co.config));
  if (!svg.empty()) check_output_paths({{svg, "--svg"}}, command_inputs(co, cfg));
  // The sim's numeric mode holds every rank's fp32 tensors and a dense
  // reference: refuse before solving when that cannot fit the memory budget.
  if (const auto mode = cfg.executor.given.find("mode");
      cfg.executor.name == "sim" && mode != cfg.executor.given.end() &&
      std::holds_alternative<std::string>(mode->second.first) && std::get<std::string>(mode->second.first) == "numeric")
    check_resources(make_problem(cfg), /*sim_numeric=*/true);
  const SessionRun run = solve_with_session(cfg, co.plugin_paths);
  const Params exec_params = resolve_selection(*run.registry, static_cast<int>(PluginKind::executor), cfg.executor);
  auto executor = run.registry->make_executor(cfg.executor.name, exec_params);
  const SolveResult& s = run.result();
  const Plan& plan = *s.plan;

  print_summary(stdout, cfg, s);
  fmt::print("plan      {} remote stage(s), built in {:.2f} ms\n", plan.num_stages, s.plan_ms);
  ExecuteInput in;
  in.grid = s.assignment->grid;
  in.problem = in.grid->problem_ptr();
  in.assignment = s.assignment.get();
  in.plan = &plan;
  const ExecutionReport rep = executor->execute(in);
  fmt::print("\nexecutor  {}\n{}", cfg.executor.name, rep.text);
  if (!rep.text.empty() && rep.text.back() != '\n') fmt::print("\n");
  // The plan's metrics come last: the table a user reads first on the terminal.
  print_metrics_table(stdout, s);
  if (!rep.passed) {
    // Outputs only after everything succeeded.
    fmt::print(stderr, "cpsched run: the executor's check FAILED{}\n", svg.empty() ? "" : "; no output written");
    return 1;
  }
  if (!svg.empty()) {
    if (rep.svg.empty()) throw Error(fmt::format("executor '{}' drew no picture for --svg", cfg.executor.name));
    write_file_atomic(svg, rep.svg);
    fmt::print("wrote {}\n", svg);
  }
  return 0;
}

}  // namespace cpsched::cli
