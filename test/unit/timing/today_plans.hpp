#pragma once
// The plans whose steps test_kernel_steps.cpp pins to the bits the timing
// model gave before the kernel model existed (profiles without a kernel
// table must keep them). Also compiled, unchanged, against that older tree
// to record the expected steps: it uses only what both have. The includer
// defines strip(HardwareProfile&), which removes the profile's kernel model
// where profiles have one.
#include <random>
#include <string>
#include <vector>

#include "cpsched/mask/generators.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/timing/model.hpp"
#include "plan_fixtures.hpp"
#include "random_specs.hpp"

namespace cpsched::test {

void strip(HardwareProfile& hw);

// f(problem, plan, profile, sheet or null) for every pinned plan, in a fixed order.
template <class F>
void for_each_today_plan(F&& f) {
  std::vector<HardwareProfile> profiles;
  for (const char* name : {"h100_8x_nvlink", "cluster_8gpu_ib"}) {
    HardwareProfile hw = resolve_hardware_profile(name);
    strip(hw);
    profiles.push_back(hw);
  }
  std::vector<Assignment> cases;
  std::mt19937_64 rng(48);
  for (const std::string& kind_name : mask_kind_names()) {
    MaskKind kind{};
    if (!parse_mask_kind(kind_name, kind)) continue;
    for (int P : {4, 16}) {
      auto grid = random_grid(kind, P, Heads{16, 8, 64, 2}, rng);
      cases.push_back(random_assignment(grid, rng));
      cases.push_back(owner_assignment(grid));
    }
  }
  // Sizes of the benchmark: documents of a few hundred to a few thousand
  // tokens, 8192 tokens per rank, GQA 64:8, D = 128.
  for (int P : {8, 16}) {
    const Token S = 8192 * P;
    MaskSpec spec;
    spec.kind = MaskKind::causal_document;
    for (Token left = S, i = 0; left > 0; ++i) {
      const Token n = std::min<Token>(left, 300 + (i * 977) % 5000);
      spec.lengths.push_back(n);
      left -= n;
    }
    for (int blocks : {1, 2}) {
      auto grid = std::make_shared<const TaskGrid>(
          std::make_shared<const Problem>(Problem::make(make_mask(spec, S), P, Heads{64, 8, 128, 2}, {true, blocks})));
      cases.push_back(owner_assignment(grid));
      cases.push_back(random_assignment(grid, rng));
    }
  }
  for (const Assignment& a : cases)
    for (const HardwareProfile& hw : profiles)
      for (PlanOptions o : {PlanOptions{1, 0}, PlanOptions{3, 0}, PlanOptions{2, 8}, PlanOptions{1, 8}}) {
        o.hardware = &hw;
        o.timer = &timing_model_timer();
        const Plan plan = build_plan(a, o);
        const PriceSheet sheet = PlanBuilder(a).price_sheet(o);
        f(a.grid->problem(), plan, hw, sheet);
      }
}

}  // namespace cpsched::test
