// The stage cut on a hardware profile (plan/builder.hpp, "Stages"): with
// PlanOptions::hardware and two or more stages the builder prices the
// receivers' cut (rule A) and the ports' cut (rule B), keeps the faster and
// ends the plan with a local tail. Its plans are valid, as fast as the
// faster cut, faster than the plan without a profile on most placements,
// the same whatever was built before, and rule B keeps every port within its
// stage's share.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/plan/shape.hpp"
#include "cpsched/plan/validator.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/timing/model.hpp"
#include "plan_checks.hpp"
#include "plan_fixtures.hpp"
#include "random_specs.hpp"

using namespace cpsched;

namespace {

// A long document's hosts export their work: tasks whose queries live on
// ranks [0, heavy) go to random ranks, the others stay on their q host but
// for a random tenth. The hosts' ports then carry far more than the rest.
Assignment skewed_assignment(std::shared_ptr<const TaskGrid> g, int heavy, std::mt19937_64& rng) {
  Assignment a = test::owner_assignment(g);
  const auto P = static_cast<std::uint64_t>(g->cp_size());
  for (TaskId t = 0; t < g->num_tasks(); ++t)
    if (g->q_host(t) < heavy || rng() % 10 == 0) a.rank[static_cast<std::size_t>(t)] = static_cast<Rank>(rng() % P);
  return a;
}

template <class F>
void for_each_case(F&& f) {
  std::mt19937_64 rng(2026);
  for (MaskKind kind : {MaskKind::causal_document, MaskKind::full_document, MaskKind::causal, MaskKind::full})
    for (int P : {12, 16, 32}) {
      auto grid = test::random_grid(kind, P, Heads{16, 8, 64, 2}, rng, Layout::fixed);
      CAPTURE(to_string(kind));
      CAPTURE(P);
      f(skewed_assignment(grid, 2, rng));
      f(test::random_assignment(grid, rng));
    }
}

}  // namespace

TEST_CASE("stage cut on a profile: valid, the faster of the two cuts on exact areas, faster than without a profile on most") {
  int faster = 0, cases = 0;
  for (const char* hw_name : {"cluster_8gpu_ib", "h100_8x_nvlink"}) {
    const HardwareProfile hw = resolve_hardware_profile(hw_name);
    HardwareProfile flat = hw;
    flat.kernel.reset();
    CAPTURE(hw_name);
    for_each_case([&](const Assignment& a) {
      for (PlanOptions o : {PlanOptions{2, 0}, PlanOptions{3, 0}, PlanOptions{4, 8}}) {
        CAPTURE(o.stages);
        CAPTURE(o.relay_node_size);
        const Problem& pr = a.grid->problem();
        const Plan plain = build_plan(a, o);
        o.hardware = &hw;
        o.timer = &timing_model_timer();
        const Plan chosen = build_plan(a, o);
        CHECK(validate_plan(a, chosen).empty());
        o.stage_cut = PlanOptions::StageCut::receivers;
        const Plan by_receivers = build_plan(a, o);
        o.stage_cut = PlanOptions::StageCut::ports;
        const Plan by_ports = build_plan(a, o);
        CHECK(validate_plan(a, by_ports).empty());
        const double x = estimate_step(pr, by_receivers, hw).step(), y = estimate_step(pr, by_ports, hw).step();
        const double z = estimate_step(pr, chosen, hw).step();
        // (Under a kernel model the cut is chosen on exact areas: the profile without its table.)
        const double xa = estimate_step(pr, by_receivers, flat).step(), ya = estimate_step(pr, by_ports, flat).step();
        CHECK(z == (ya < xa ? y : x));
        CHECK(test::same_plan(chosen, ya < xa ? by_ports : by_receivers));
        if (!hw.kernel) CHECK(z == std::min(x, y));
        if (z < estimate_step(pr, plain, hw).step()) ++faster;
        ++cases;
      }
    });
  }
  MESSAGE(faster << " of " << cases << " plans faster than without a profile");
  CHECK(faster * 2 >= cases);
  PlanOptions ports{2, 0};
  ports.stage_cut = PlanOptions::StageCut::ports;
  std::mt19937_64 rng(1);
  const Assignment a = test::random_assignment(test::random_grid(MaskKind::causal, 16, Heads{16, 8, 64, 2}, rng), rng);
  CHECK_THROWS_WITH_AS(build_plan(a, ports), doctest::Contains("needs a hardware profile"), Error);
}

TEST_CASE("the local tail: one more stage that moves nothing and computes the second half of each rank's local work") {
  const HardwareProfile hw = resolve_hardware_profile("h100_8x_nvlink");
  int tails = 0;
  for_each_case([&](const Assignment& a) {
    for (int stages : {1, 2, 4}) {
      PlanOptions o{stages, 0};
      o.hardware = &hw;
      o.timer = &timing_model_timer();
      const Plan plan = build_plan(a, o);
      CAPTURE(stages);
      CHECK(plan.local_tail == (stages >= 2));
      CHECK(plan.num_stages == stages + (plan.local_tail ? 1 : 0));
      CHECK(validate_plan(a, plan).empty());
      if (!plan.local_tail) continue;
      const TaskGrid& g = *a.grid;
      std::vector<std::int64_t> local(static_cast<std::size_t>(g.cp_size()), 0);
      for (TaskId t = 0; t < g.num_tasks(); ++t)
        if (const Rank r = a.rank[static_cast<std::size_t>(t)]; g.q_host(t) == r && g.k_host(t) == r)
          local[static_cast<std::size_t>(r)] += g.load(t);
      for (std::size_t r = 0; r < plan.ranks.size(); ++r) {
        const PassPlan& pp = plan.ranks[r].fwd;
        const StageComm& last = pp.comm.stages.back();
        CHECK(last.num_remote_qo_tokens + last.num_remote_kv_tokens == 0);
        CHECK(last.qo.input_split_sizes.empty());
        CHECK(last.kv.input_split_sizes.empty());
        std::int64_t stage0 = 0, tail = 0;
        for (const AttnArg& x : pp.calc.local_attn_args) stage0 += arg_area(x, pp.calc) * g.problem().q_heads_per_task();
        for (const AttnArg& x : pp.calc.remote_attn_args.back()) {
          CHECK(x.q_buf == BufferId::local);
          CHECK(x.k_buf == BufferId::local);
          tail += arg_area(x, pp.calc) * g.problem().q_heads_per_task();
        }
        CHECK(stage0 + tail == local[r]);
        CHECK(2 * stage0 >= local[r]);
        tails += tail > 0;
      }
    }
  });
  CHECK(tails > 50);
}

TEST_CASE("stage cut on a profile: one choice per shape, whatever the builder built before; one stage has no tail") {
  const HardwareProfile hw = resolve_hardware_profile("cluster_8gpu_ib");
  const HardwareProfile other = resolve_hardware_profile("h100_8x_nvlink");
  for_each_case([&](const Assignment& a) {
    const PlanBuilder b(a);
    // A price sheet first (what pricing makes, which chooses the cut), then
    // the full plans, another profile in between: each equals a fresh build's.
    for (const HardwareProfile* p : {&hw, &other, &hw}) {
      PlanOptions priced{3, 0};
      priced.hardware = p;
      priced.timer = &timing_model_timer();
      (void)b.price_sheet(priced);
      for (PlanOptions o : {PlanOptions{3, 0}, PlanOptions{2, 8}, PlanOptions{1, 0}}) {
        o.hardware = p;
        o.timer = &timing_model_timer();
        CAPTURE(p->name);
        CAPTURE(o.stages);
        CHECK(test::same_plan(b.build(o), build_plan(a, o)));
      }
    }
    PlanOptions one{1, 8};
    const Plan plain = build_plan(a, one);
    one.hardware = &hw;
    one.timer = &timing_model_timer();
    CHECK(test::same_plan(build_plan(a, one), plain));
    // The price sheet prices as the full plan of the same choice.
    PlanOptions full{3, 8};
    full.hardware = &hw;
    full.timer = &timing_model_timer();
    const Problem& pr = a.grid->problem();
    CHECK(estimate_step(pr, PlanBuilder(a).price_sheet(full), hw).step() ==
          estimate_step(pr, build_plan(a, full), hw).step());
  });
}

namespace {

// The ports' loads of one pass of a plan without relays, per stage: [stage][port]
// with port = (rank, out / in, between / inside nodes), as rule B weighs them.
std::vector<std::vector<double>> port_loads(const Plan& plan, Pass pass, const TransferBytes& bytes,
                                            const HardwareProfile& hw) {
  const std::size_t P = plan.ranks.size();
  std::vector<std::vector<double>> load(static_cast<std::size_t>(plan.num_stages), std::vector<double>(P * 4, 0.0));
  const double intra_cost = hw.inter_node.bandwidth_gb_s / hw.intra_node.bandwidth_gb_s;
  for (std::size_t r = 0; r < P; ++r) {
    const PassPlan& pp = pass == Pass::fwd ? plan.ranks[r].fwd : plan.ranks[r].bwd;
    for (std::size_t s = 0; s < pp.comm.stages.size(); ++s)
      for (bool qo : {true, false}) {
        const GroupCollectiveArg& g = qo ? pp.comm.stages[s].qo : pp.comm.stages[s].kv;
        for (std::size_t i = 0; i < g.dst_indices.size(); ++i)
          for (Rank d : g.dst_indices[i]) {
            const bool intra = hw.nodes().same_node(static_cast<Rank>(r), d);
            const double l = static_cast<double>(g.input_split_sizes[i] * (qo ? bytes.qo_out : bytes.kv_out)) *
                             (intra ? intra_cost : 1.0);
            load[s][(r * 2 + 0) * 2 + (intra ? 1 : 0)] += l;
            load[s][(static_cast<std::size_t>(d) * 2 + 1) * 2 + (intra ? 1 : 0)] += l;
          }
      }
  }
  return load;
}

}  // namespace

TEST_CASE("the ports' cut: before the last stage no port carries more than its stage's share of the busiest port") {
  const HardwareProfile hw = resolve_hardware_profile("cluster_8gpu_ib");
  int checked = 0;
  for_each_case([&](const Assignment& a) {
    for (int stages : {2, 3, 5}) {
      PlanOptions o{stages, 0};
      o.hardware = &hw;
      o.timer = &timing_model_timer();
      o.stage_cut = PlanOptions::StageCut::ports;
      const Plan chosen = build_plan(a, o);
      CAPTURE(stages);
      for (Pass pass : {Pass::fwd, Pass::bwd}) {
        const auto load = port_loads(chosen, pass, pass == Pass::fwd ? fwd_bytes_per_token(a.grid->problem())
                                                                     : bwd_bytes_per_token(a.grid->problem()), hw);
        std::vector<double> total(load[0].size(), 0.0);
        for (const auto& st : load)
          for (std::size_t p = 0; p < st.size(); ++p) total[p] += st[p];
        const double busiest = *std::max_element(total.begin(), total.end());
        double weights = 0;
        for (int s = 0; s < stages; ++s) weights += std::pow(1.5, s);
        for (int s = 0; s + 1 < stages; ++s) {  // (stage `stages` + 1 is the local tail: nothing moves)
          const double room = busiest * 1.1 * std::pow(1.5, s) / weights;
          for (double l : load[static_cast<std::size_t>(s)]) CHECK(l <= room * (1 + 1e-9));
        }
        // First fit: what fits early goes early, so stage 1 is not left empty.
        double first = 0;
        for (double l : load[0]) first += l;
        CHECK(first > 0);
        ++checked;
      }
    }
  });
  CHECK(checked > 20);
}

TEST_CASE("the builder times its choices with the caller's timer: without one, a build that must choose throws") {
  const HardwareProfile hw = resolve_hardware_profile("cluster_8gpu_ib");
  // A timer that counts its calls and answers as the timing model.
  struct Counting final : StepTimer {
    mutable int calls = 0;
    StepEstimate step(const Problem& p, const PriceSheet& s, const HardwareProfile& h) const override {
      ++calls;
      return timing_model_timer().step(p, s, h);
    }
  };
  int timed = 0;
  for_each_case([&](const Assignment& a) {
    PlanOptions o{3, 0};
    o.hardware = &hw;
    // Choosing the cut, building a sheet and pricing all need the timer.
    CHECK_THROWS_WITH_AS(build_plan(a, o), doctest::Contains("PlanOptions::timer"), Error);
    CHECK_THROWS_WITH_AS((void)PlanBuilder(a).price_sheet(o), doctest::Contains("PlanOptions::timer"), Error);
    CHECK_THROWS_WITH_AS((void)PlanBuilder(a).price(o), doctest::Contains("PlanOptions::timer"), Error);
    // The cut named, or one stage, chooses nothing.
    PlanOptions named = o;
    named.stage_cut = PlanShape::Cut::ports;
    CHECK_NOTHROW((void)build_plan(a, named));
    PlanOptions one{1, 0};
    one.hardware = &hw;
    CHECK_NOTHROW((void)build_plan(a, one));
    // The plan is the one of the timer's choice: the timer handed in is the one asked.
    const Counting counting;
    o.timer = &counting;
    const Plan p = build_plan(a, o);
    o.timer = &timing_model_timer();
    CHECK(test::same_plan(p, build_plan(a, o)));
    timed += counting.calls > 0 ? 1 : 0;
  });
  // (Where the two cuts are the same there is nothing to time.)
  CHECK(timed > 0);
}

TEST_CASE("a plan shape carries a solver's cut, for its own stage count only") {
  const PlanShape choice = PlanShape::fixed(2, 0, PlanShape::Cut::ports);
  PlanShape asked;
  asked.stages = PlanShape::kAutoStages;
  asked.relay = PlanShape::Relay::automatic;
  const PlanShape resolved = asked.resolve(choice);
  CHECK(resolved.stages == 2);
  CHECK(resolved.cut == PlanShape::Cut::ports);
  CHECK(resolved.str() == "2 stages, no relays, the ports' cut");
  // A cut chosen for 2 stages says nothing of 3: the builder prices both there.
  CHECK(PlanShape::fixed(3).resolve(choice).cut == PlanShape::Cut::automatic);
  // The user's cut, where a caller sets one, stays.
  CHECK(PlanShape::fixed(2, 0, PlanShape::Cut::receivers).resolve(choice).cut == PlanShape::Cut::receivers);
  CHECK(PlanShape::fixed(2).str() == "2 stages, no relays");
}
