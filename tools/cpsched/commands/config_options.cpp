#include <fmt/format.h>

#include "commands/commands.hpp"
#include "cpsched/problem/resources.hpp"

namespace po = boost::program_options;

namespace cpsched::cli {

void ConfigOptions::add_to(po::options_description& desc) {
  desc.add_options()
      ("set", po::value(&sets)->composing(), "override a config value: --set key.path=YAML (repeatable)")
      ("plugin-path", po::value(&plugin_paths)->composing(), "extra plugin folder (repeatable)")
      ("print-config", po::bool_switch(&print_config), "print the effective config (after --set) and go on");
}

bool ConfigOptions::parse(const Args& args, const char* command, const char* summary, po::options_description& desc,
                          po::variables_map& vm) {
  desc.add_options()("help,h", "show this help");
  po::options_description all;
  all.add(desc).add_options()("config", po::value(&config), "config file");
  po::positional_options_description pos;
  pos.add("config", 1);
  po::store(po::command_line_parser(args).options(all).positional(pos).run(), vm);
  if (vm.count("help")) {
    fmt::print("usage: cpsched {} CONFIG [options]\n{}\n\n", command, summary);
    std::ostringstream os;
    os << desc;
    fmt::print("{}", os.str());
    return false;
  }
  po::notify(vm);
  if (config.empty()) throw po::error(fmt::format("'cpsched {}' needs a CONFIG file", command));
  return true;
}

Config ConfigOptions::load() const {
  Config cfg = load_config(config, sets);
  // Every later check (grids, plans, the sim) of this process uses it.
  if (cfg.memory_budget > 0) set_memory_budget(cfg.memory_budget, "memory_budget in " + config);
  if (print_config) fmt::print("# effective config of {}\n{}\n", config, cfg.effective_yaml);
  return cfg;
}

std::vector<std::pair<std::filesystem::path, std::string>> command_inputs(const ConfigOptions& co, const Config& cfg) {
  std::vector<std::pair<std::filesystem::path, std::string>> in;
  in.emplace_back(co.config, "config");
  for (const auto& [path, key] : cfg.input_files) in.emplace_back(path, "file of " + key);
  return in;
}

}  // namespace cpsched::cli
