// Pricing candidate plans cheaply (what balanced_bytes does before choosing):
// PlanBuilder reuses one assignment's transfers across builds and gives
// build_plan's plans; price sheets time exactly like the full plans; and
// the step lower bound never exceeds the timing model's step, so skipping a
// plan whose bound reaches the best step so far loses nothing.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <random>

#include "cpsched/base/error.hpp"
#include "cpsched/plugin/cost_model.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/pricing/host_pricing.hpp"
#include "cpsched/search/placements.hpp"
#include "cpsched/timing/step_bound.hpp"
#include "cpsched/timing/model.hpp"
#include "plan_checks.hpp"
#include "plan_fixtures.hpp"
#include "random_specs.hpp"

using namespace cpsched;

namespace {

// Random problems of every mask kind at a few sizes (two or four nodes of
// eight on the bundled profiles), with random and owner placements.
template <class F>
void for_each_case(F&& f) {
  std::mt19937_64 rng(77);
  for (const std::string& kind_name : mask_kind_names()) {
    MaskKind kind{};
    REQUIRE(parse_mask_kind(kind_name, kind));
    for (int P : {4, 16, 32}) {
      auto grid = test::random_grid(kind, P, Heads{16, 8, 64, 2}, rng);
      CAPTURE(kind_name);
      CAPTURE(P);
      f(test::random_assignment(grid, rng));
      f(test::owner_assignment(grid));
    }
  }
}

}  // namespace

TEST_CASE("PlanBuilder: every build equals build_plan's, in any order of options") {
  int plans = 0;
  for_each_case([&](const Assignment& a) {
    const PlanBuilder b(a);
    // Stage counts out of order, relays in between: the cached send orders
    // must not leak one build's options into the next.
    for (PlanOptions o : {PlanOptions{3, 0}, PlanOptions{1, 0}, PlanOptions{4, 8}, PlanOptions{2, 0},
                          PlanOptions{3, 8}, PlanOptions{1, 8}}) {
      CAPTURE(o.stages);
      CAPTURE(o.relay_node_size);
      CHECK(test::same_plan(b.build(o), build_plan(a, o)));
      ++plans;
    }
  });
  CHECK(plans > 100);
}

namespace {

// Tokens each rank sends to each peer (receives: from each peer) per (pass,
// stage, kind, phase; kinds 2 and 3 are the relays' forwarding phase): all
// the timing model reads of comm besides the stage structure.
std::map<std::tuple<int, Rank, std::size_t, int, Rank>, Token> sent(const Plan& plan, bool receives = false) {
  std::map<std::tuple<int, Rank, std::size_t, int, Rank>, Token> out;
  for (std::size_t r = 0; r < plan.ranks.size(); ++r)
    for (int pass = 0; pass < 2; ++pass) {
      const PassPlan& pp = pass == 0 ? plan.ranks[r].fwd : plan.ranks[r].bwd;
      for (std::size_t s = 0; s < pp.comm.stages.size(); ++s)
        for (int k = 0; k < 4; ++k) {
          const StageComm& sc = pp.comm.stages[s];
          const GroupCollectiveArg& g = k == 0 ? sc.qo : k == 1 ? sc.kv : k == 2 ? sc.qo_fwd : sc.kv_fwd;
          if (receives)
            for (std::size_t j = 0; j < g.src_index.size(); ++j)
              out[{pass, static_cast<Rank>(r), s, k, g.src_index[j]}] += g.output_split_sizes[j];
          else
            for (std::size_t i = 0; i < g.dst_indices.size(); ++i)
              for (Rank d : g.dst_indices[i]) out[{pass, static_cast<Rank>(r), s, k, d}] += g.input_split_sizes[i];
        }
    }
  return out;
}


// The same from a price sheet (kinds 2 and 3: phase 1).
std::map<std::tuple<int, Rank, std::size_t, int, Rank>, Token> sent(const PriceSheet& sheet, bool receives = false) {
  std::map<std::tuple<int, Rank, std::size_t, int, Rank>, Token> out;
  for (int pass = 0; pass < 2; ++pass) {
    const PriceSheet::Pass& p = pass == 0 ? sheet.fwd : sheet.bwd;
    for (Rank r = 0; r < sheet.ranks; ++r)
      for (int s = 1; s <= sheet.stages; ++s)
        for (int kind = 0; kind < 2; ++kind)
          for (int phase = 0; phase < 2; ++phase) {
            const std::size_t i = sheet.part(r, s, kind, phase);
            const auto& begin = receives ? p.recv_begin : p.send_begin;
            const auto& splits = receives ? p.recv : p.send;
            std::vector<Rank> peers;
            for (auto k = begin[i]; k < begin[i + 1]; ++k) {
              const PriceSheet::Split& x = splits[static_cast<std::size_t>(k)];
              out[{pass, r, static_cast<std::size_t>(s - 1), kind + 2 * phase, x.peer}] += x.tokens;
              peers.push_back(x.peer);
            }
            std::sort(peers.begin(), peers.end());
            CHECK(std::adjacent_find(peers.begin(), peers.end()) == peers.end());  // one split per peer
          }
  }
  return out;
}

}  // namespace

TEST_CASE("price sheets: the plan's tokens per peer and areas per stage, and its step to the last bit") {
  int forwarded = 0;  // plans that relay something
  int kernel_forwarded = 0;  // the same under the kernel model
  for (const char* hw_name : {"cluster_8gpu_ib", "h100_8x_nvlink"}) {
    // The bundled profile (with its kernel model) and the same without it.
    const HardwareProfile hw = resolve_hardware_profile(hw_name);
    REQUIRE(hw.kernel);
    HardwareProfile flat = hw;
    flat.kernel.reset();
    for_each_case([&](const Assignment& a) {
      for (PlanOptions o : {PlanOptions{1, 0}, PlanOptions{3, 0}, PlanOptions{2, 8}, PlanOptions{1, 8}}) {
        for (const HardwareProfile* profile : {static_cast<const HardwareProfile*>(nullptr), static_cast<const HardwareProfile*>(&flat), static_cast<const HardwareProfile*>(&hw)}) {
          o.hardware = profile;  // with a profile, two or more stages: the cut chosen and the local tail
          o.timer = &timing_model_timer();
          const HardwareProfile& on = profile ? *profile : flat;  // a sheet without a profile prices without kernels
          CAPTURE(o.stages);
          CAPTURE(o.relay_node_size);
          CAPTURE(profile != nullptr);
          CAPTURE(on.kernel.has_value());
          const Plan full = build_plan(a, o);
          const PriceSheet sheet = PlanBuilder(a).price_sheet(o);
          REQUIRE(sheet.ranks == a.grid->cp_size());
          REQUIRE(sheet.stages == full.num_stages);
          CHECK(sheet.local_tail == full.local_tail);
          CHECK(sent(sheet) == sent(full));
          CHECK(sent(sheet, true) == sent(full, true));
          CHECK(sheet.has_forwarding() == full.has_forwarding());
          forwarded += full.has_forwarding();
          for (int pass = 0; pass < 2; ++pass) {
            const PriceSheet::Pass& sp = pass == 0 ? sheet.fwd : sheet.bwd;
            for (std::size_t r = 0; r < full.ranks.size(); ++r) {
              const PassPlan& pp = pass == 0 ? full.ranks[r].fwd : full.ranks[r].bwd;
              for (int s = 0; s <= full.num_stages; ++s) {
                Token area = 0;
                for (const AttnArg& x : s == 0 ? pp.calc.local_attn_args
                                               : pp.calc.remote_attn_args[static_cast<std::size_t>(s - 1)])
                  area += arg_area(x, pp.calc);
                CHECK(sp.area[r * static_cast<std::size_t>(full.num_stages + 1) + static_cast<std::size_t>(s)] == area);
              }
              for (int s = 1; s <= full.num_stages; ++s) {
                CHECK(sp.qo_reduce_after[static_cast<std::size_t>(s - 1)] ==
                      pp.comm.stages[static_cast<std::size_t>(s - 1)].qo_reduce_after);
                CHECK(sp.kv_reduce_after[static_cast<std::size_t>(s - 1)] ==
                      pp.comm.stages[static_cast<std::size_t>(s - 1)].kv_reduce_after);
              }
            }
          }
          const Problem& p = a.grid->problem();
          // (Under a kernel model too: a relay's forwarded rows land apart
          // from the direct ones, and the sheet cuts the args there as the
          // plan does.)
          const StepEstimate x = estimate_step(p, full, on), y = estimate_step(p, sheet, on);
          CHECK(y.fwd == x.fwd);
          CHECK(y.bwd == x.bwd);
          CHECK(y.compute_bound == x.compute_bound);
          CHECK(y.compute_floor == x.compute_floor);
          if (!on.kernel) CHECK(x.compute_floor == x.compute_bound);
          if (on.kernel) kernel_forwarded += full.has_forwarding();
          if (profile != nullptr) {  // the builder's own pricing, which reuses the cut's timing
            bool forwards = !full.has_forwarding();
            const StepEstimate z = PlanBuilder(a).price(o, &forwards);
            CHECK(z.step() == x.step());
            CHECK(z.compute_bound == x.compute_bound);
            CHECK(forwards == full.has_forwarding());
          }
        }
      }
    });
  }
  CHECK(forwarded > 20);
  CHECK(kernel_forwarded > 10);
}

TEST_CASE("both prices: under the kernel model and on exact areas, each what its own profile's pricing gives") {
  // HostPricing::price_both against two hosts, one on the bundled profile
  // and one on it without its kernel table, to the bit, in any order of
  // shapes, a cut named or automatic (chosen on exact areas on both).
  int cuts_differ = 0;  // automatic shapes where the two profiles took different cuts
  for (const char* hw_name : {"cluster_8gpu_ib", "h100_8x_nvlink"}) {
    const HardwareProfile hw = resolve_hardware_profile(hw_name);
    REQUIRE(hw.kernel);
    HardwareProfile flat = hw;
    flat.kernel.reset();
    for_each_case([&](const Assignment& a) {
      HostPricing both(hw), kern(hw), areas(flat), plain(flat);
      const auto grid = a.grid;
      const auto pb = both.add(grid, a.rank), pk = kern.add(grid, a.rank), pa = areas.add(grid, a.rank),
                 pp = plain.add(grid, a.rank);
      for (const PlanShape& shape :
           {PlanShape::fixed(2, 0), PlanShape::fixed(1, 0), PlanShape::fixed(3, 8), PlanShape::fixed(2, 0),
            PlanShape::fixed(2, 8, PlanShape::Cut::ports), PlanShape::fixed(3, 0, PlanShape::Cut::receivers)}) {
        CAPTURE(shape.str());
        const PlanPrices got = both.price_both(pb, shape);
        const PlanPrice k = kern.price(pk, shape), f = areas.price(pa, shape);
        CHECK(got.kernels.step == k.step);
        CHECK(got.kernels.compute_bound == k.compute_bound);
        CHECK(got.kernels.forwards == k.forwards);
        CHECK(got.areas.step == f.step);
        CHECK(got.areas.compute_bound == f.compute_bound);
        CHECK(got.areas.forwards == f.forwards);
        const PlanPrice alone = both.price_on_areas(pb, shape);  // (the areas' price alone, to the bit)
        CHECK(alone.step == f.step);
        CHECK(alone.compute_bound == f.compute_bound);
        if (shape.stages >= 2 && shape.cut == PlanShape::Cut::automatic) {
          const PlanBuilder* b = both.builder_of(a);
          REQUIRE(b != nullptr);
          PlanOptions ok{shape.stages, shape.relay_node_size()}, oa = ok;
          ok.hardware = &hw;
          ok.timer = &timing_model_timer();
          oa.hardware = &flat;
          oa.timer = &timing_model_timer();
          cuts_differ += b->cut_of(ok) != b->cut_of(oa);
        }
        // Without a kernel model both are the one price.
        const PlanPrices same = plain.price_both(pp, shape);
        CHECK(same.kernels.step == f.step);
        CHECK(same.areas.step == f.step);
      }
      CHECK(both.bound_on_areas(pb).plain == areas.bound(pa).plain);
      CHECK(both.bound_on_areas(pb).relayed == areas.bound(pa).relayed);
      CHECK(both.bound_on_areas(pb).may_forward == areas.bound(pa).may_forward);
      CHECK(both.bound(pb).plain == kern.bound(pk).plain);
      // A plan built on either profile from the builder that priced both is the one its own pricing chose.
      for (const HardwareProfile* on : {&hw, static_cast<const HardwareProfile*>(&flat)}) {
        PlanOptions o{2, 0};
        o.hardware = on;
        o.timer = &timing_model_timer();
        CHECK(test::same_plan(both.builder_of(a)->build(o), build_plan(a, o)));
      }
    });
  }
  // Under a kernel model the automatic cut is chosen on exact areas (chosen_cut), so both profiles take one cut.
  CHECK(cuts_differ == 0);
}

TEST_CASE("price sheets: every rank or none, a profile to price on; a sheet that does not fit the problem is refused") {
  std::mt19937_64 rng(5);
  const Assignment a = test::owner_assignment(test::random_grid(MaskKind::causal_document, 8, Heads{16, 8, 64, 2}, rng));
  PlanOptions one_rank{2, 0};
  one_rank.rank = 3;
  CHECK_THROWS_WITH_AS(PlanBuilder(a).price_sheet(one_rank),
                       "plan: a price sheet covers every rank (PlanOptions::rank must be -1, got 3)", Error);
  CHECK_THROWS_WITH_AS(PlanBuilder(a).price(PlanOptions{2, 0}),
                       "plan: pricing a plan needs a hardware profile (PlanOptions::hardware)", Error);
  HardwareProfile hw = resolve_hardware_profile("h100_8x_nvlink");
  PriceSheet sheet = PlanBuilder(a).price_sheet(PlanOptions{2, 0});
  // A sheet made without the profile has no kernel seconds to price on it.
  CHECK_THROWS_WITH_AS(estimate_step(a.grid->problem(), sheet, hw),
                       "timing model: the price sheet was not made for the kernel model of profile 'h100_8x_nvlink' "
                       "(PlanOptions::hardware names the profile a sheet is priced on)",
                       Error);
  PlanOptions other_rates{2, 0};
  HardwareProfile faster = hw;
  faster.kernel->fwd.tile_tflops[0][0] *= 2;
  other_rates.hardware = &faster;
  other_rates.timer = &timing_model_timer();
  CHECK_THROWS_AS(estimate_step(a.grid->problem(), PlanBuilder(a).price_sheet(other_rates), hw), Error);
  hw.kernel.reset();
  std::mt19937_64 rng2(5);
  const auto other = test::random_grid(MaskKind::causal_document, 16, Heads{16, 8, 64, 2}, rng2);
  CHECK_THROWS_WITH_AS(estimate_step(other->problem(), sheet, hw),
                       "timing model: the price sheet has 8 ranks and 2 stages, the problem 16 ranks", Error);
  sheet.bwd.area.pop_back();
  CHECK_THROWS_WITH_AS(estimate_step(a.grid->problem(), sheet, hw),
                       "timing model: the bwd price sheet's arrays do not match its 8 ranks and 2 stages", Error);
}

TEST_CASE("step lower bound: at most the step of every plan of the placement, and not trivial") {
  for (const std::string hw_name : {"h100_8x_nvlink", "cluster_8gpu_ib"}) {
    const HardwareProfile hw = resolve_hardware_profile(hw_name);
    const TimePrices tp = time_prices(hw);
    CAPTURE(hw_name);
    double tightest = 0;
    for_each_case([&](const Assignment& a) {
      const StepBound b = step_lower_bound(*a.grid, a.rank, PlanBuilder(a).transfers(), tp, tp.nodes.gpus_per_node);
      // The metrics' transfers (another order) give the same bound.
      const StepBound m = step_lower_bound(*a.grid, a.rank, transfers(a), tp, tp.nodes.gpus_per_node);
      CHECK(m.plain == doctest::Approx(b.plain).epsilon(1e-12));
      CHECK(m.relayed == doctest::Approx(b.relayed).epsilon(1e-12));
      CHECK(m.may_forward == b.may_forward);
      CHECK(b.relayed <= b.plain);
      CHECK(b.relayed > 0);
      const Problem& p = a.grid->problem();
      for (int stages : {1, 2, 3, 5}) {
        CAPTURE(stages);
        const Plan plain = build_plan(a, stages);
        const double step = estimate_step(p, plain, hw).step();
        CHECK(b.plain <= step);
        tightest = std::max(tightest, b.plain / step);
        const Plan relayed = build_plan(a, PlanOptions{stages, tp.nodes.gpus_per_node});
        CHECK(b.relayed <= estimate_step(p, relayed, hw).step());
        // No possible forwarding: the relayed plan is the plain one.
        if (!b.may_forward) CHECK_FALSE(relayed.has_forwarding());
      }
    });
    // Ports and compute make the bound reach most of the step somewhere.
    CHECK(tightest > 0.5);
  }
}

TEST_CASE("hybrid placement: short documents stay home, a long one spreads its head groups over the node") {
  // P = 16 (two nodes of 8), 64 tokens per rank, GQA 64:8: documents inside
  // one shard need no remote KV, so every task stays with its q block's host;
  // one causal document over the whole sequence makes later blocks read KV
  // from many ranks and the other node: those blocks go to usp's ranks, each
  // head group to its own rank of the host's node.
  const double byte_s[2] = {1 / 360e9, 1 / 45e9};
  const Heads heads{64, 8, 128, 2};
  std::vector<Slice> local;
  for (Token s = 0; s < 16 * 64; s += 32) local.push_back({{s, s + 32}, {s, s + 32}, MaskType::causal});
  auto short_docs = test::make_grid(RangeMask(16 * 64, local), 16, heads, {true, 1});
  CHECK(search::hybrid_placement(*short_docs, 8, byte_s, 8) == search::owner_placement(*short_docs));

  auto one_doc = test::make_grid(RangeMask(16 * 64, {{{0, 16 * 64}, {0, 16 * 64}, MaskType::causal}}), 16, heads,
                                 {true, 1});
  const std::vector<Rank> h = search::hybrid_placement(*one_doc, 8, byte_s, 8);
  const std::vector<Rank> usp = search::usp_placement(*one_doc, 8);
  REQUIRE(h.size() == usp.size());
  int spread = 0, home = 0;
  for (TaskId t = 0; t < one_doc->num_tasks(); ++t) {
    const auto i = static_cast<std::size_t>(t);
    const bool is_usp = h[i] == usp[i], is_owner = h[i] == one_doc->q_host(t);
    CHECK((is_usp || is_owner));
    CHECK(h[i] / 8 == one_doc->q_host(t) / 8);  // never leaves the host's node
    if (one_doc->cell_of(t).qblock == 0) CHECK(is_owner);  // the first block reads only its own KV
    spread += is_usp && !is_owner;
    home += is_owner && !is_usp;
  }
  CHECK(spread > 0);
  CHECK(home > 0);
  // Not flattened: no per-group choice to make.
  auto whole = test::make_grid(RangeMask(16 * 64, {{{0, 16 * 64}, {0, 16 * 64}, MaskType::causal}}), 16, heads,
                               {false, 1});
  CHECK(search::hybrid_placement(*whole, 8, byte_s, 8).empty());
}
