#pragma once
// Sub-commands of the `cpsched` tool. Each takes the arguments after its name
// and returns the process exit code; errors are thrown as cpsched::Error.
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "cpsched/config/config.hpp"

namespace cpsched::cli {

using Args = std::vector<std::string>;

int cmd_plugins(const Args& args);
int cmd_check(const Args& args);
int cmd_plan(const Args& args);
int cmd_run(const Args& args);
int cmd_compare(const Args& args);

// Options every config-reading command shares: CONFIG, --set, --plugin-path,
// --print-config.
struct ConfigOptions {
  std::string config;
  std::vector<std::string> sets;
  std::vector<std::string> plugin_paths;
  bool print_config = false;

  void add_to(boost::program_options::options_description& desc);
  // Parses args into `vm` (CONFIG is the one positional argument); returns
  // false when --help was given (usage printed).
  bool parse(const Args& args, const char* command, const char* summary,
             boost::program_options::options_description& desc,
             boost::program_options::variables_map& vm);
  Config load() const;  // prints the effective config when asked
};

// The files a command reads (the config and what it names), for
// check_output_paths: no output may replace one of them.
std::vector<std::pair<std::filesystem::path, std::string>> command_inputs(const ConfigOptions& co, const Config& cfg);

}  // namespace cpsched::cli
