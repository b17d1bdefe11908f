// Executor plugin `sim`: the simulated runtime. Numeric mode runs the plan on
// P virtual ranks with real float32 tensors and checks the result against a
// dense reference; timing mode (the default) prices the plan on a hardware
// profile without tensors. Both report the timeline as an SVG Gantt chart.
#include <cpsched/plugin/executor.hpp>
#include <cpsched/plugin/plugin.hpp>

#include "sim_runner.hpp"

namespace {

class SimExecutor final : public cpsched::Executor {
 public:
  explicit SimExecutor(const cpsched::Params& p) : opt_(cpsched::sim::parse_sim_options(p)) {}
  cpsched::ExecutionReport execute(const cpsched::ExecuteInput& in) override { return cpsched::sim::run_sim(in, opt_); }

 private:
  cpsched::sim::SimOptions opt_;
};

const cpsched_param_spec kParams[] = {
    {"mode", CPSCHED_PARAM_STRING, "timing",
     "numeric: run the plan on virtual ranks with real tensors and check it; timing: metadata only"},
    {"hardware", CPSCHED_PARAM_STRING, cpsched::kDefaultHardwareProfile,
     "hardware profile of the timing model: a bundled name (h100_8x_nvlink, h200_8x_nvlink, cluster_8gpu_ib) or a "
     "YAML file"},
    {"seed", CPSCHED_PARAM_INT, "-1", "seed of the numeric tensors (-1: the run's seed)"},
    {"check_tolerance", CPSCHED_PARAM_REAL, "1e-4", "numeric check: largest relative error allowed (vs max |ref|)"},
    {"threads", CPSCHED_PARAM_INT, "0", "threads of the numeric mode (0: all cores); results do not depend on it"},
    {"svg_max_ranks", CPSCHED_PARAM_INT, "64", "timeline SVG: at most this many ranks (the slowest)"},
    {"max_numeric_gib", CPSCHED_PARAM_REAL, "8", "numeric mode refuses problems needing more tensor memory"}};

}  // namespace

CPSCHED_EXECUTOR_PLUGIN(SimExecutor, "sim",
                        "simulated runtime: exact attention over P virtual ranks (numeric) and a timing model of the "
                        "overlapped execution (timing)",
                        kParams)
