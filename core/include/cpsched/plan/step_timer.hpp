#pragma once
// How a plan builder prices the choices it makes on a hardware profile (the
// automatic stage cut keeps the faster of two cuts; PlanBuilder::price prices
// a shape): the step of a plan from its price sheet. The plan layer declares
// the interface and the caller hands in an implementation
// (PlanOptions::timer): the timing model's is timing/model.hpp's
// timing_model_timer(). So plans do not include the model that times them
// (docs/architecture.md, "Layers").
#include "cpsched/hardware/profile.hpp"
#include "cpsched/plan/price_sheet.hpp"
#include "cpsched/problem/problem.hpp"

namespace cpsched {

// The step time of a plan and its yardstick, the compute bound: the sum over
// ranks of their compute time (fwd + bwd) / P, i.e. perfect balance with free
// communication (no merges either). Seconds.
struct StepEstimate {
  double fwd = 0;
  double bwd = 0;
  double compute_bound = 0;
  // The plan's compute at the kernels' rates / P (all its ranks' compute
  // streams' args, fwd + bwd): the floor no step of a plan this size of work
  // goes below. compute_bound without a kernel model.
  double compute_floor = 0;
  double step() const { return fwd + bwd; }
  double ratio() const { return compute_bound > 0 ? step() / compute_bound : 1.0; }
};

class StepTimer {
 public:
  virtual ~StepTimer() = default;
  // The step of the plan `sheet` describes, on `hw`: the same, to the bit, as
  // of the plan itself. Thread safe.
  virtual StepEstimate step(const Problem& problem, const PriceSheet& sheet, const HardwareProfile& hw) const = 0;
};

}  // namespace cpsched
