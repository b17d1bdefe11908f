#pragma once
// Configuration (docs/design.md#configuration): YAML file + `--set key.path=value` overrides,
// validated with every error located (file:line:column and key path) and all
// errors of a file reported at once.
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cpsched/mask/generators.hpp"
#include "cpsched/plugin/params.hpp"
#include "cpsched/plan/shape.hpp"
#include "cpsched/plan/uses.hpp"
#include <optional>
#include "cpsched/problem/problem.hpp"

namespace cpsched {

class Registry;

// Where a value came from: "configs/x.yaml:12:5" or "--set solver.name".
struct Location {
  std::string source;
  int line = 0;    // 1-based; 0 when unknown
  int column = 0;  // 1-based
  std::string str() const;
};

struct PluginSelection {
  std::string name;
  Location name_loc;
  // Parameter block of the selected plugin: name -> (value, where).
  std::map<std::string, std::pair<ParamValue, Location>> given;
  Location params_loc;
  // Defaults inherited from the top level of the config (`hardware:`): used
  // by resolve_selection for a parameter the plugin declares and `given`
  // does not set (the plugin's own block is more specific and wins).
  std::map<std::string, std::pair<ParamValue, Location>> inherited;
  Params given_params() const;
};

struct Config {
  std::filesystem::path file;
  int cp_size = 8;
  Token seqlen_per_rank = 8192;
  Heads heads;
  GridOptions grid;
  // problem.layout (fixed, the default, or planned) and problem.host_ranges
  // (the shards of a fixed layout when not the sequential ones).
  Layout layout = Layout::fixed;
  std::vector<std::vector<Range>> host_ranges;
  MaskSpec mask;
  PluginSelection solver;
  PluginSelection cost_model;
  PluginSelection executor;
  // plan.stages and plan.relay. Relays on or auto leave the node size 0:
  // Session::options_from takes it from the config's hardware profile.
  PlanShape plan;
  // plan.uses: a number of attention calls or `ahead`; absent: by the layout
  // (fixed: 1, planned: ahead, as a planned layout is made in the data loader).
  std::optional<PlanUses> uses;
  int cache_size = 64;
  // Top-level `memory_budget:` ("16G", "512M", bytes; 0 when absent): the
  // budget of the up-front resource checks (resources.hpp), before
  // CPSCHED_MEMORY_BUDGET and MemAvailable.
  std::int64_t memory_budget = 0;
  std::vector<std::filesystem::path> plugin_paths;
  // Top-level `hardware:` (empty when absent): a bundled profile name or a
  // profile YAML path (made relative to the config's folder). It becomes the
  // `hardware` parameter of the cost model and the executor (see inherited).
  std::string hardware;
  Location hardware_loc;
  std::string effective_yaml;  // the merged document, for --print-config
  // The files the config names and that are read (a hardware profile, a
  // document-length histogram, .npy arrays), each with its key: the
  // commands refuse an output that would replace one (check_output_paths).
  std::vector<std::pair<std::filesystem::path, std::string>> input_files;

  // Where the problem and its mask were given, so that errors found later
  // (make_problem) still point into the file.
  Location problem_loc;
  Location mask_loc;
  // The `compare` section, reserved for the compare tool: its YAML text
  // (empty when absent) and where it was given.
  std::string compare_yaml;
  Location compare_loc;

  Token seqlen() const { return static_cast<Token>(cp_size) * seqlen_per_rank; }
};

// Throws cpsched::Error whose message lists every problem found, one per line.
Config load_config(const std::filesystem::path& file,
                   const std::vector<std::string>& overrides = {});
// Same, from text (source names it in messages).
Config parse_config(const std::string& yaml_text, const std::string& source,
                    const std::vector<std::string>& overrides = {});

// Checks plugin names and parameter blocks against the registry; errors carry
// the config location. Returns resolved parameters.
Params resolve_selection(const Registry& reg, int kind /*PluginKind*/, const PluginSelection& sel);

Problem make_problem(const Config& cfg);

}  // namespace cpsched
