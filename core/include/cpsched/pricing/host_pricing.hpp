#pragma once
// The host's pricing service (plugin/pricing.hpp): the timing model on
// (placement, plan shape) for a solver, with what it built kept so that the
// solve path builds the chosen plan from it. One per solve.
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "cpsched/plan/builder.hpp"
#include "cpsched/plugin/pricing.hpp"
#include "cpsched/hardware/profile.hpp"

namespace cpsched {

class HostPricing final : public PlanPricing {
 public:
  explicit HostPricing(HardwareProfile hw);
  ~HostPricing();

  Placement add(std::shared_ptr<const TaskGrid> grid, std::vector<Rank> rank) override;
  StepBound bound(Placement p) override;
  PlanPrice price(Placement p, const PlanShape& shape) override;
  StepBound bound_on_areas(Placement p) override;
  PlanPrices price_both(Placement p, const PlanShape& shape) override;
  PlanPrice price_on_areas(Placement p, const PlanShape& shape) override;

  // The builder of the registered placement equal to `a` (the same grid
  // object and ranks), or null. For the solve path, after the solve.
  const PlanBuilder* builder_of(const Assignment& a) const;
  std::size_t size() const;
  std::size_t plans_priced() const;

 private:
  struct Entry;
  Entry& entry(Placement p);
  PlanPrice price_on(Placement p, const PlanShape& shape, const HardwareProfile& hw);
  HardwareProfile hw_;
  HardwareProfile areas_;  // hw_ without its kernel model
  mutable std::mutex mu_;
  std::deque<Entry> entries_;  // stable addresses: queries lock one entry, not the list
};

}  // namespace cpsched
