#include "check.hpp"

#include <fmt/format.h>

#include "cpsched/error.hpp"
#include "inputs.hpp"
#include "virtual_ranks.hpp"

namespace cpsched::gpu {

CheckResult check_against_sim(const Problem& p, const Plan& plan, const std::vector<RankOutputs>& outputs,
                              std::uint64_t seed, double tolerance, int threads) {
  if (static_cast<int>(outputs.size()) != plan.sharding.cp_size)
    throw Error(fmt::format("cuda_nccl check: {} ranks' outputs for {} ranks", outputs.size(), plan.sharding.cp_size));
  const sim::GlobalInputs in = global_inputs(p, seed);
  const sim::VirtualRun ref = sim::run_virtual_ranks(p, plan, in, threads);
  sim::GlobalOutputs got = sim::GlobalOutputs::like(in, 0.f, neg_inf());
  const HeadLayout h = HeadLayout::of(p);
  for (Rank r = 0; r < plan.sharding.cp_size; ++r)
    place_outputs(plan.sharding, r, h, outputs[static_cast<std::size_t>(r)], got);
  CheckResult c;
  c.errors = sim::compare_outputs(got, ref.outputs);
  c.tolerance = tolerance;
  c.passed = c.errors.max() <= tolerance;
  c.text = fmt::format(
      "self-check against the sim runtime (max |diff| / max |ref|, tolerance {:.1e}): "
      "O {:.2e}, lse {:.2e}, dQ {:.2e}, dK {:.2e}, dV {:.2e}: {}",
      tolerance, c.errors.o, c.errors.lse, c.errors.dq, c.errors.dk, c.errors.dv, c.passed ? "passed" : "FAILED");
  return c;
}

}  // namespace cpsched::gpu
