#pragma once
// The self-check: the same plan through the sim runtime's numeric engine on
// the same bf16-exact inputs, compared tensor by tensor (largest absolute
// difference over the largest reference value, as the sim's own check).
// Differences come from fp32 summation order and from the partial results
// that travel in bf16 (O, dQ, dK, dV on the wire; O rounded for the
// backward), so the tolerance is bf16-sized, not fp32-sized.
#include <string>
#include <vector>

#include "cpsched/plan.hpp"
#include "cpsched/problem.hpp"
#include "numeric_check.hpp"
#include "pipeline.hpp"

namespace cpsched::gpu {

inline constexpr double kDefaultTolerance = 2e-2;

struct CheckResult {
  sim::NumericErrors errors;
  double tolerance = kDefaultTolerance;
  bool passed = false;
  std::string text;  // one line per tensor
};

// outputs[r]: rank r's results under plan.sharding. threads: 0 = all cores.
CheckResult check_against_sim(const Problem& p, const Plan& plan, const std::vector<RankOutputs>& outputs,
                              std::uint64_t seed, double tolerance, int threads = 0);

}  // namespace cpsched::gpu
