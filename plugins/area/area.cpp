// Cost model plugin `area`: the seed's model (compute = area, transfer =
// tokens x heads), i.e. cpsched::AreaCostModel behind the plugin contract.
#include <cpsched/plugin/cost_model.hpp>
#include <cpsched/plugin/plugin.hpp>

namespace {

class AreaModel final : public cpsched::CostModel {
 public:
  explicit AreaModel(const cpsched::Params&) {}
  double compute(const cpsched::TaskGrid& g, cpsched::TaskId t) const override {
    return model_.compute(g, t);
  }
  double transfer(cpsched::RowKind kind, cpsched::Token tokens, int heads, cpsched::Rank src,
                  cpsched::Rank dst) const override {
    return model_.transfer(kind, tokens, heads, src, dst);
  }

 private:
  cpsched::AreaCostModel model_;
};

}  // namespace

CPSCHED_COST_MODEL_PLUGIN_NOPARAMS(AreaModel, "area",
                                   "the seed's model: compute = area, transfer = tokens x heads")
