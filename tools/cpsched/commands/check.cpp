#include <fmt/format.h>

#include "commands/commands.hpp"
#include "cpsched/plugin/registry.hpp"
#include "commands/plugin_folders.hpp"

namespace po = boost::program_options;

namespace cpsched::cli {

int cmd_check(const Args& args) {
  ConfigOptions co;
  po::options_description desc("options");
  co.add_to(desc);
  po::variables_map vm;
  if (!co.parse(args, "check", "Validates the config, its plugins and parameters, and its mask.", desc, vm)) return 0;
  const Config cfg = co.load();
  Registry reg;
  scan_plugins(reg, &cfg, co.plugin_paths);
  resolve_selection(reg, static_cast<int>(PluginKind::solver), cfg.solver);
  resolve_selection(reg, static_cast<int>(PluginKind::cost_model), cfg.cost_model);
  if (!cfg.executor.name.empty()) resolve_selection(reg, static_cast<int>(PluginKind::executor), cfg.executor);
  const Problem p = make_problem(cfg);
  fmt::print("{}: ok ({} tokens, P = {}, {} mask slices, solver {}, executor {}{})\n", co.config, p.seqlen(),
             p.cp_size(), p.mask.slices().size(), cfg.solver.name, cfg.executor.name,
             cfg.hardware.empty() ? std::string() : ", hardware " + cfg.hardware);
  return 0;
}

}  // namespace cpsched::cli
