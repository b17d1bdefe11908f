// Cost model plugin `time`: prices in seconds on a hardware profile (the same
// profiles as the sim executor; a top-level `hardware:` key sets both), i.e.
// cpsched::TimeCostModel behind the plugin contract.
#include <cpsched/plugin/cost_model.hpp>
#include <cpsched/timing/hardware.hpp>
#include <cpsched/plugin/plugin.hpp>

namespace {

class TimeModel final : public cpsched::CostModel {
 public:
  explicit TimeModel(const cpsched::Params& p)
      : model_(cpsched::resolve_hardware_profile(p.get_string("hardware"))) {}
  double compute(const cpsched::TaskGrid& g, cpsched::TaskId t) const override { return model_.compute(g, t); }
  double transfer(cpsched::RowKind kind, cpsched::Token tokens, int heads, cpsched::Rank src,
                  cpsched::Rank dst) const override {
    return model_.transfer(kind, tokens, heads, src, dst);
  }
  double transfer(const cpsched::TaskGrid& g, cpsched::RowKind kind, cpsched::Token tokens, int heads,
                  cpsched::Rank src, cpsched::Rank dst) const override {
    return model_.transfer(g, kind, tokens, heads, src, dst);
  }
  std::optional<cpsched::TimePrices> time_prices() const override { return model_.time_prices(); }
  std::optional<cpsched::StepEstimate> plan_time(const cpsched::Problem& p, const cpsched::Plan& plan) const override {
    return model_.plan_time(p, plan);
  }

 private:
  cpsched::TimeCostModel model_;
};

const cpsched_param_spec kParams[] = {
    {"hardware", CPSCHED_PARAM_STRING, cpsched::kDefaultHardwareProfile,
     "hardware profile: a bundled name (h100_8x_nvlink, h200_8x_nvlink, cluster_8gpu_ib) or a path to a profile "
     "YAML; the top-level `hardware:` key sets it"},
};

}  // namespace

CPSCHED_COST_MODEL_PLUGIN(TimeModel, "time",
                          "seconds on a hardware profile: compute = FLOPs / throughput, transfers = bytes / bandwidth "
                          "of the link class of (src, dst), forward and backward; prices whole plans with the sim's "
                          "timing model",
                          kParams)
