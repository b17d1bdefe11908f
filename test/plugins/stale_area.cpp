// A cost model plugin named `area`, as an older build installed one: the
// name now belongs to a built-in, so the registry must refuse the file.
#include <cpsched/plugin/cost_model.hpp>
#include <cpsched/plugin/plugin.hpp>

namespace {

class StaleArea final : public cpsched::CostModel {
 public:
  explicit StaleArea(const cpsched::Params&) {}
  double compute(const cpsched::TaskGrid&, cpsched::TaskId) const override { return 1.0; }
  double transfer(const cpsched::TaskGrid&, cpsched::RowKind, cpsched::Token, int, cpsched::Rank,
                  cpsched::Rank) const override {
    return 1.0;
  }
};

}  // namespace

CPSCHED_COST_MODEL_PLUGIN_NOPARAMS(StaleArea, "area", "a stale copy of the built-in area model")
