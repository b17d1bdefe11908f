#pragma once
// Index args through the CPU emulation, checked twice: against the sim
// runtime running the same plan, and against the sim's dense reference (each
// KV head's boolean mask, key by key), which does not read the plan.
#include <memory>
#include <vector>

#include "cpsched/mask/generators.hpp"
#include "host/run/check.hpp"
#include "host/run/emulate.hpp"
#include "host/run/inputs.hpp"
#include "numeric_check.hpp"
#include "plans.hpp"
#include "reference.hpp"

namespace cpsched::test {

namespace g = cpsched::gpu;

inline std::shared_ptr<const IndexMask> dsa_mask(Token S, std::vector<Token> lengths, std::uint64_t seed) {
  MaskSpec spec;
  spec.kind = MaskKind::dsa;
  spec.lengths = std::move(lengths);
  spec.seed = seed;
  spec.topk = 24;
  spec.sink = 4;
  spec.local = 8;
  return std::make_shared<const IndexMask>(make_index_mask(spec, S));
}

inline int count_index_args(const Plan& plan, bool remote_only) {
  int n = 0;
  for (const RankPlan& rp : plan.ranks)
    for (const PassPlan* pp : {&rp.fwd, &rp.bwd}) {
      if (!remote_only)
        for (const AttnArg& a : pp->calc.local_attn_args) n += a.is_index() ? 1 : 0;
      for (const auto& s : pp->calc.remote_attn_args)
        for (const AttnArg& a : s) n += a.is_index() ? 1 : 0;
    }
  return n;
}

// The ranks' outputs at their global tokens (MLA: O, dO and dV of d_v, a shared latent's dK only).
inline sim::GlobalOutputs gathered(const test::PlanCase& c, const g::EmulatedRun& run, const sim::GlobalInputs& in) {
  sim::GlobalOutputs out = sim::GlobalOutputs::like(in, 0.f, 0.f);
  const g::HeadLayout h = g::HeadLayout::of(*c.problem);
  for (Rank r = 0; r < c.plan.sharding.cp_size; ++r)
    g::place_outputs(c.plan.sharding, r, h, run.outputs[static_cast<std::size_t>(r)], out);
  return out;
}

struct Checked {
  g::CheckResult plan;      // against the sim running the same plan
  double dense_error = 0;   // against the dense reference
  bool passed() const { return plan.passed && dense_error <= g::kDefaultTolerance; }
};

inline Checked run_and_check(const test::PlanCase& c, g::Schedule s = g::Schedule::eager, g::EmulatedRun* out = nullptr) {
  const g::HeadLayout h = g::HeadLayout::of(*c.problem);
  std::vector<g::RankInputs> in;
  for (Rank r = 0; r < c.plan.sharding.cp_size; ++r) in.push_back(g::shard_inputs(*c.problem, c.plan.sharding, r, 7));
  g::EmulatedRun run = g::emulate(c.plan, h, in, s);
  Checked res;
  res.plan = g::check_against_sim(*c.problem, c.plan, run.outputs, 7, g::kDefaultTolerance, 2);
  const sim::GlobalInputs gi = g::global_inputs(*c.problem, 7);
  res.dense_error = sim::compare_outputs(gathered(c, run, gi), sim::dense_reference(*c.problem, gi, 2)).max();
  if (out != nullptr) *out = std::move(run);
  return res;
}


}  // namespace cpsched::test
