#pragma once
// How a plan will be used: how many attention calls run it, and whether it
// is made ahead of need. What users pay per call is
//   (the planning time on the critical path) / uses + the step,
// so a plan used once must be made quickly, and one made ahead (in the data
// loader, or for the next step while this one runs) may take its time.
#include <string>

namespace cpsched {

struct PlanUses {
  static constexpr int kAhead = 0;
  // Attention calls that run the plan (>= 1), or kAhead: made ahead of need,
  // off the critical path.
  int uses = 1;

  static PlanUses ahead() { return {kAhead}; }
  bool is_ahead() const { return uses == kAhead; }
  // The weight of planning time beside the step: 1 / uses, 0 ahead.
  double planning_weight() const { return is_ahead() ? 0.0 : 1.0 / uses; }
  // "1", "32", "ahead".
  std::string str() const { return is_ahead() ? "ahead" : std::to_string(uses); }
  // Checks uses >= 0; `who` prefixes the message. Throws cpsched::Error.
  void validate(const std::string& who) const;
  friend bool operator==(const PlanUses&, const PlanUses&) = default;
};

}  // namespace cpsched
