#pragma once
// The sweep of `cpsched compare`: read from the config's `compare:` section,
// with defaults taken from the rest of the config and from the plugins found.
//
//   compare:
//     solvers: [binary_greedy, usp]     # default: every solver plugin found
//     masks: [full, causal_document]    # mask kinds; default: problem.mask.kind
//     cp_sizes: [8, 16, 32]             # default: problem.cp_size
//     packs: 20                         # count (packs 0..n-1) or list [0, 3]; default: problem.mask.pack
//     heads: [{q: 64, kv: 8}]           # optional dim too; default: problem.heads
//     stages: [1, 2]                    # plan stages; default: plan.stages
//     layouts: [fixed, planned]         # problem.layout per row; default: problem.layout
//     uses: [1, 8, ahead]               # plan.uses per row; default: plan.uses (absent: by the layout)
//     rank_path: true                   # also time each rank's own plan (the slowest rank's whole path;
//                                       # each rank's plan the median of `repeats` builds)
//     repeats: 5                        # solve-latency repeats (median)
//     repeats_per_solver: {ilp: 1}      # per-solver override; default: 1 for a solver with a
//                                       # `time_limit_s` parameter (its solve costs that long), else `repeats`
//     reference: usp                    # the solver whose placement is the "usp placement" baseline
//     timing: {executor: sim}           # or `timing: none`; `hardware: NAME` here is the
//                                       # one-profile form of compare.hardware (not both)
//     hardware: [h100_8x_nvlink, cluster_8gpu_ib]   # a sweep axis: profile names or YAML paths;
//                                       # default: the top-level `hardware:`, else h100_8x_nvlink
//     max_cp_size: {ilp: 16}            # run a slow solver only up to this P (rows above say "skipped")
//
// Every other mask parameter (histogram, seed, window, ...) comes from
// problem.mask; packs apply only to document masks sampled from a histogram.
//
// Hardware is an axis of its own: every row carries its profile. Timing runs
// the executor on each profile; when the cost model plugin declares a
// `hardware` parameter the solvers see a cost model per profile (so they are
// solved per profile), otherwise one solve per point is timed on every profile.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cpsched/config/config.hpp"
#include "cpsched/plan/shape.hpp"
#include "cpsched/plan/uses.hpp"
#include "cpsched/problem/problem.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/plugin/registry.hpp"

namespace cpsched::cli {

struct HeadConfig {
  int q = 64;
  int kv = 8;
  int dim = 128;
};

struct CompareSpec {
  std::vector<std::string> solvers;
  std::vector<MaskKind> masks;
  std::vector<int> cp_sizes;
  std::vector<int> packs;
  std::vector<HeadConfig> heads;
  std::vector<int> stages;
  std::vector<Layout> layouts;
  std::vector<std::optional<PlanUses>> uses;  // nullopt: by the layout (fixed: 1, planned: ahead)
  // Time every rank's own plan (PlanOptions::rank) after the solve: the
  // per-rank whole path is grid + solve + the slowest rank's plan. P builds
  // per point, so off by default.
  bool rank_path = false;
  // Set by `cpsched compare --plans DIR` (not a config key): every solved
  // plan's JSON is written there, timings left out, so two builds' plans can
  // be compared byte for byte.
  std::string plans_dir;
  // plan.relay for every row: off, on (nodes of the profile's size) or auto
  // (a solver that prices plans chooses; the others plan without).
  PlanShape::Relay relay = PlanShape::Relay::off;
  int repeats = 3;
  std::map<std::string, int> repeats_per_solver;  // per solver; absent: see solver_repeats()
  std::string reference = "usp";   // empty: no baseline plugin was found
  bool timing = true;
  std::string timing_executor = "sim";
  // The hardware axis: names as given (bundled names or paths) and their
  // profiles. Empty when nothing uses a profile (timing off and a cost model
  // without a `hardware` parameter): rows then carry no hardware.
  std::vector<std::string> hardware = {kDefaultHardwareProfile};
  std::vector<HardwareProfile> hardware_profiles;
  // What the plugins' `hardware` parameter gets: the name, or a relative
  // path made relative to the config's folder (as every path of a config).
  std::vector<std::string> hardware_specs;
  bool cost_model_hardware = false;  // the cost model plugin declares `hardware`
  std::map<std::string, int> max_cp_size;  // per solver; absent: no limit
};

// Throws cpsched::Error naming the key (compare.<key>) and where its value
// was given (`overrides`: the --set arguments the config was loaded with).
// Solvers default to the solver plugins of `reg`, sorted by name.
CompareSpec read_compare_spec(const Config& cfg, const Registry& reg, const std::vector<std::string>& overrides);

// How often `solver` is solved per sweep point: compare.repeats_per_solver,
// else 1 when its parameter block has `time_limit_s` (an exact solver that
// may spend its whole limit each time), else compare.repeats.
int solver_repeats(const CompareSpec& spec, const std::string& solver, const Params& solver_params);

// Whether a mask's documents (and so the pack) depend on the pack index.
bool mask_uses_packs(const MaskSpec& spec, MaskKind kind);

}  // namespace cpsched::cli
