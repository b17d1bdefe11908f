#pragma once
// The sweep of `cpsched compare`: every solver on every (heads, mask, P, pack)
// problem and every plan stage count, measured the same way; then the mean
// over packs.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "compare/spec.hpp"
#include "cpsched/config/config.hpp"
#include "cpsched/plugin/registry.hpp"

namespace cpsched::cli {

class Progress;

// Figures of one row. Volumes in bytes (all ranks); times in milliseconds.
struct CompareFigures {
  double fwd_send = 0, fwd_bottleneck = 0;
  double bwd_send = 0, bwd_bottleneck = 0;
  double usp_closed_fwd = 0;           // USP's closed form x P (docs/design.md#metrics)
  std::optional<double> ref_fwd;       // the reference (`usp`) solver's measured placement
  std::optional<double> ref_bwd;
  // The `ilp` solver's forward send at the same point and stages, when it ran
  // there and met its balance target (aggregated: the mean over packs).
  std::optional<double> ilp_fwd;
  // `ilp` rows only, read from its note: the proven lower bound of its forward
  // total send (aggregated: the mean) and the packs where it proved optimality.
  std::optional<double> ilp_bound;
  std::optional<int> ilp_proven_packs;
  double imbalance = 1.0;              // aggregated: the largest over packs
  double stage0_share = 0.0;
  int feasible_packs = 0;              // packs where the solver met its balance target
  double latency_ms = 0;               // median of repeats: grid + solve + plan build
  double grid_ms = 0, solve_ms = 0, plan_ms = 0;  // medians of each part
  // From the timing executor (absent when timing is off or it is missing).
  std::optional<double> fwd_step_ms, bwd_step_ms;
  std::optional<double> fwd_exposed_ms, bwd_exposed_ms;
  // The plan's compute bound on the row's hardware (cpsched::compute_bound:
  // total compute / P, free communication); absent without a profile.
  // Aggregated: the mean, so step / bound on a mean row is a ratio of means.
  std::optional<double> compute_bound_ms;
  // compare.rank_path: grid + solve + the slowest rank's own plan (median of
  // the repeats' solves, one timing of each rank's build). Aggregated: the mean.
  std::optional<double> rank_path_ms;
};

// Step time over the compute bound (>= 1 up to the imbalance); nullopt when
// either is missing.
std::optional<double> step_over_bound(const CompareFigures& f);

struct CompareRow {
  std::string mask;
  int cp_size = 0;
  HeadConfig heads;
  int stages = 1;
  std::string hardware;     // the profile as given in compare.hardware; empty: no hardware axis
  Layout layout = Layout::fixed;           // problem.layout of the row
  std::optional<PlanUses> asked_uses;      // compare.uses' entry (nullopt: by the layout)
  PlanUses uses;                           // what the solve was told, resolved
  std::string solver;
  int pack = -1;            // -1: the mask does not depend on the pack
  bool aggregate = false;   // the mean over packs
  int packs = 1;            // packs aggregated (1 for a per-pack row)
  bool ok = true;
  bool skipped = false;     // not run on purpose (compare.max_cp_size); `error` says why
  std::string error;        // why the solver (or plan) failed, or was skipped
  std::string note;         // the solver's remark, a timing problem, ...
  std::string solver_note;  // per-pack rows: the solver's own account of its answer (Solution::note)
  CompareFigures f;
};

// What one use of the plan costs against the bound: (path / uses + step) /
// bound, with the per-rank path when measured, else the whole path; a plan
// made ahead costs its step. nullopt without a step or bound.
std::optional<double> cost_per_use(const CompareRow& r);

// Percent saved against a baseline: 100 x (1 - value / baseline).
std::optional<double> reduction_pct(double value, std::optional<double> baseline);

struct CompareResult {
  std::vector<CompareRow> per_pack;    // sweep order
  std::vector<CompareRow> aggregated;  // one per (heads, mask, P, stages, hardware, solver)
  std::vector<std::string> warnings;   // said once, printed by the caller
  std::string timing_label;            // e.g. "sim executor on hardware h100_8x_nvlink"; empty: no timing
  std::vector<std::string> hardware;   // the hardware axis in order (empty: none)
  // Solved once per profile (the cost model takes `hardware`): volumes,
  // imbalance and latency then differ by hardware too.
  bool solved_per_hardware = false;
};

// Loads the config again with extra --set overrides (to read the parameter
// block of each solver and of the timing executor as `run` would).
using ConfigLoader = std::function<Config(const std::vector<std::string>& extra_sets)>;

// Solver runs the sweep makes (for the progress bar).
long compare_work_units(const Config& cfg, const CompareSpec& spec);

CompareResult run_compare(const Config& cfg, const CompareSpec& spec, const Registry& reg,
                          const ConfigLoader& load, Progress& progress);

}  // namespace cpsched::cli
