#pragma once
// The sim executor's work, independent of the plugin shell: read options
// from parameters, run the numeric check (numeric mode) and the timing model
// (always), and assemble the report.
#include <cstdint>

#include "cpsched/plugin/executor.hpp"
#include "cpsched/plugin/params.hpp"
#include "cpsched/hardware/profile.hpp"

namespace cpsched::sim {

enum class SimMode { timing, numeric };

struct SimOptions {
  SimMode mode = SimMode::timing;
  HardwareProfile hardware;
  std::int64_t seed = -1;         // < 0: ExecuteInput::seed
  double tolerance = 1e-4;
  int threads = 0;                // 0: all cores
  int svg_max_ranks = 64;
  double max_numeric_gib = 8;     // numeric mode refuses larger runs
};

// Parameters: mode, hardware, seed, check_tolerance, threads, svg_max_ranks,
// max_numeric_gib (missing ones keep their defaults). Throws cpsched::Error
// naming the parameter and value.
SimOptions parse_sim_options(const Params& p);

ExecutionReport run_sim(const ExecuteInput& in, const SimOptions& opt);

}  // namespace cpsched::sim
