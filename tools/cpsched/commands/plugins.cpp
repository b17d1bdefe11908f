#include <fmt/format.h>

#include "commands/commands.hpp"
#include "cpsched/plugin/registry.hpp"
#include "commands/plugin_folders.hpp"

namespace po = boost::program_options;

namespace cpsched::cli {

int cmd_plugins(const Args& args) {
  std::vector<std::string> dirs;
  po::options_description desc("options");
  desc.add_options()("plugin-path", po::value(&dirs)->composing(), "extra plugin folder (repeatable)")(
      "help,h", "show this help");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(desc).run(), vm);
  if (vm.count("help")) {
    std::ostringstream os;
    os << desc;
    fmt::print("usage: cpsched plugins [--plugin-path DIR]...\n\n{}", os.str());
    return 0;
  }
  po::notify(vm);
  Registry reg;
  scan_plugins(reg, nullptr, dirs, /*warn=*/false);
  for (PluginKind kind : {PluginKind::solver, PluginKind::cost_model, PluginKind::executor}) {
    fmt::print("{}s:\n", to_string(kind));
    for (const PluginInfo& p : reg.plugins()) {
      if (p.kind != kind) continue;
      fmt::print("  {:<16} {}\n  {:<16} ({})\n", p.name, p.doc, "", p.file.string());
      for (const ParamSpec& s : p.params)
        fmt::print("  {:<16}   {:<14} {:<7} default {:<8} {}\n", "", s.name, to_string(s.type),
                   format_param(s.default_value), s.doc);
    }
  }
  if (!reg.problems().empty()) {
    fmt::print("\nplugin files that could not be loaded:\n");
    for (const PluginProblem& p : reg.problems()) fmt::print("  {}\n", p.message);
  }
  return 0;
}

}  // namespace cpsched::cli
