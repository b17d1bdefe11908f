#pragma once
// Under a kernel model the time mode plans as it does without one, and takes
// the fastest of the plans it priced under the kernel model.
//
// The search and every decision (which phases run, which placements are
// priced, at which stages and relays) read the profile without its kernel
// table: exact areas at the peak rate, today's default to the bit. Planning
// ahead, each plan it prices is priced from the same price sheet under the
// kernel model too (PlanPricing::price_both: one more run of the timing
// model), and where today's pick is static's dispatch, that dispatch cut at
// the kernels' tiles both ways (time_mode.cpp); the plan kept is the fastest
// of those under the kernel model (today's pick is among them wherever it was
// priced, so it is never slower than today's under the kernel model;
// unpriced, today's plan is kept), then the search on the kernels' seconds
// runs too, and the faster of the two plans is taken (time_mode.cpp). Used a few times the plan is today's, at today's
// cost: pricing under the kernel model as well cost more and changed no plan
// (docs/bounds.md#the-default-solvers-phase-constants).
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <cpsched/plugin/pricing.hpp>
#include <cpsched/plugin/solver.hpp>

namespace cpsched::search {

// Forwards to the host's pricing, answering on exact areas (bound_on_areas,
// price_both's areas) and keeping the kernels' price of every plan priced.
class AreasFirstPricing final : public PlanPricing {
 public:
  // keep_kernels: price each plan under the kernel model too (price_both);
  // else on exact areas alone (price_on_areas: what today's default costs).
  AreasFirstPricing(PlanPricing& host, bool keep_kernels) : host_(host), keep_kernels_(keep_kernels) {}

  Placement add(std::shared_ptr<const TaskGrid> grid, std::vector<Rank> rank) override;
  StepBound bound(Placement p) override { return host_.bound_on_areas(p); }
  PlanPrice price(Placement p, const PlanShape& shape) override {
    return keep_kernels_ ? price_both(p, shape).areas : host_.price_on_areas(p, shape);
  }
  PlanPrice price_on_areas(Placement p, const PlanShape& shape) override { return price(p, shape); }
  StepBound bound_on_areas(Placement p) override { return host_.bound_on_areas(p); }
  // (To its caller both are the areas' price: it knows no kernel model.)
  PlanPrices price_both(Placement p, const PlanShape& shape) override;

  // A plan priced: its placement, shape and both prices.
  struct Priced {
    std::shared_ptr<const TaskGrid> grid;
    const std::vector<Rank>* rank;  // (the placement's, kept here)
    PlanShape shape;
    PlanPrices prices;
    bool today;  // today's pick itself
  };
  // The fastest plan priced under the kernel model, today's (`rank` on `grid`
  // at `shape`, resolved against `asked`) where it is among the fastest (equal
  // steps), else the first of them in an order that does not depend on the
  // order of pricing; nullopt where nothing was priced or today's plan was not
  // priced (then today's plan is the answer).
  std::optional<Priced> fastest_on_kernels(const std::shared_ptr<const TaskGrid>& grid, const std::vector<Rank>& rank,
                                           const PlanShape& shape, const PlanShape& asked) const;

 private:
  struct Placed {
    Placement host;
    std::shared_ptr<const TaskGrid> grid;
    std::unique_ptr<const std::vector<Rank>> rank;
  };
  PlanPricing& host_;
  bool keep_kernels_;
  mutable std::mutex mu_;
  std::vector<Placed> placed_;                         // by the host's placement handle
  std::vector<std::pair<Placement, PlanShape>> keys_;  // the plans priced (each once)
  std::vector<PlanPrices> prices_;
};

}  // namespace cpsched::search
