#include <fmt/format.h>
#include <fmt/ranges.h>

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
  // What the mask is: slices for range masks; the selection for index masks
  // (which hold no slices: "0 mask slices" would say the mask is empty).
  std::string what;
  if (p.index_mask) {
    const IndexMask& m = *p.index_mask;
    what = fmt::format("{} mask [{}], {} selected pairs", to_string(cfg.mask.kind), fmt::join(m.indices.shape, ", "),
                       static_cast<std::int64_t>(m.area()));
  } else if (!p.head_masks.empty()) {
    std::size_t slices = 0;
    for (const RangeMask& m : p.head_masks) slices += m.slices().size();
    what = fmt::format("{} mask, one per KV head ({} heads, {} slices)", to_string(cfg.mask.kind), p.head_masks.size(),
                       slices);
  } else {
    what = fmt::format("{} mask, {} slices", to_string(cfg.mask.kind), p.mask.slices().size());
  }
  fmt::print("{}: ok ({} tokens, P = {}, {}, solver {}, executor {}{})\n", co.config, p.seqlen(), p.cp_size(), what,
             cfg.solver.name, cfg.executor.name, cfg.hardware.empty() ? std::string() : ", hardware " + cfg.hardware);
  return 0;
}

}  // namespace cpsched::cli
