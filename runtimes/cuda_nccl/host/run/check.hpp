#pragma once
// The self-check: the same plan through the sim runtime's numeric engine on
// the same bf16-exact inputs, compared tensor by tensor (largest absolute
// difference over the largest reference value, as the sim's own check).
// Differences come from fp32 summation order and from the partial results
// that travel in bf16 (O, dQ, dK, dV on the wire; O rounded for the
// backward), so the tolerance is bf16-sized, not fp32-sized.
//
// The comparison runs rank by rank: rank 0 holds the reference and one
// rank's outputs at a time (never every rank's fp32 tensors), and the result
// equals the whole-tensor comparison because both its terms are maxima.
#include <string>
#include <vector>

#include "cpsched/plan/plan.hpp"
#include "cpsched/problem/problem.hpp"
#include "host/plan/layout.hpp"
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

class RankwiseCheck {
 public:
  // Runs the reference (the sim runtime on the whole plan). threads: 0 = all cores.
  RankwiseCheck(const Problem& p, const Plan& plan, std::uint64_t seed, int threads = 0);
  // Compares rank r's outputs with the reference at its tokens. Each rank
  // once; throws cpsched::Error when the sizes do not match its rows.
  void add(Rank r, const RankOutputs& out);
  // After every rank was added (else cpsched::Error naming the missing one).
  CheckResult finish(double tolerance) const;

 private:
  struct Max {  // max |got - ref| and max |ref| so far; broken: NaN or an unmatched infinity
    double diff = 0, ref = 0;
    bool broken = false;
    double error() const;
  };
  Sharding sharding_;
  HeadLayout h_;
  sim::GlobalOutputs ref_;
  Max o_, lse_, dq_, dk_, dv_;
  std::vector<bool> seen_;
};

// All ranks' outputs at once (outputs[r]: rank r's results under plan.sharding).
CheckResult check_against_sim(const Problem& p, const Plan& plan, const std::vector<RankOutputs>& outputs,
                              std::uint64_t seed, double tolerance, int threads = 0);

}  // namespace cpsched::gpu
