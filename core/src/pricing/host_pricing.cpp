#include "cpsched/pricing/host_pricing.hpp"

#include <algorithm>

#include "cpsched/base/error.hpp"
#include "cpsched/timing/model.hpp"
#include "cpsched/timing/step_bound.hpp"

namespace cpsched {

struct HostPricing::Entry {
  std::shared_ptr<const TaskGrid> grid;
  std::vector<Rank> rank;
  std::mutex mu;                          // one query of this placement at a time
  std::unique_ptr<PlanBuilder> builder;   // made by the first query
  std::optional<StepBound> bound, bound_on_areas;
  std::size_t priced = 0;

  PlanBuilder& get_builder() {
    if (!builder) {
      Assignment a;
      a.grid = grid;
      a.rank = rank;
      builder = std::make_unique<PlanBuilder>(std::move(a));
    }
    return *builder;
  }
};

HostPricing::HostPricing(HardwareProfile hw) : hw_(std::move(hw)), areas_(hw_) { areas_.kernel.reset(); }
HostPricing::~HostPricing() = default;

HostPricing::Entry& HostPricing::entry(Placement p) {
  std::lock_guard<std::mutex> lock(mu_);
  if (p >= entries_.size()) throw Error("pricing: no placement " + std::to_string(p) + " was added");
  return entries_[p];
}

HostPricing::Placement HostPricing::add(std::shared_ptr<const TaskGrid> grid, std::vector<Rank> rank) {
  if (!grid) throw Error("pricing: a placement needs its grid");
  if (rank.size() != static_cast<std::size_t>(grid->num_tasks()))
    throw Error("pricing: a placement of " + std::to_string(rank.size()) + " ranks for a grid of " +
                std::to_string(grid->num_tasks()) + " tasks");
  std::lock_guard<std::mutex> lock(mu_);
  for (std::size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].grid.get() == grid.get() && entries_[i].rank == rank) return i;
  Entry& e = entries_.emplace_back();
  e.grid = std::move(grid);
  e.rank = std::move(rank);
  return entries_.size() - 1;
}

StepBound HostPricing::bound(Placement p) {
  Entry& e = entry(p);
  std::lock_guard<std::mutex> lock(e.mu);
  if (!e.bound)
    e.bound = step_lower_bound(*e.grid, e.rank, e.get_builder().transfers(), time_prices(hw_), hw_.gpus_per_node);
  return *e.bound;
}

StepBound HostPricing::bound_on_areas(Placement p) {
  if (!hw_.kernel) return bound(p);
  Entry& e = entry(p);
  std::lock_guard<std::mutex> lock(e.mu);
  if (!e.bound_on_areas)
    e.bound_on_areas =
        step_lower_bound(*e.grid, e.rank, e.get_builder().transfers(), time_prices(areas_), areas_.gpus_per_node);
  return *e.bound_on_areas;
}

namespace {

// The builder's options that price `shape` (resolved) on `hw`.
PlanOptions pricing_options(const PlanShape& shape, const HardwareProfile& hw) {
  if (!shape.resolved()) throw Error("pricing: the shape " + shape.str() + " is not resolved");
  PlanOptions po{shape.stages, shape.relay_node_size()};
  po.hardware = &hw;
  po.stage_cut = shape.cut;
  po.timer = &timing_model_timer();
  return po;
}

}  // namespace

PlanPrices HostPricing::price_both(Placement p, const PlanShape& shape) {
  if (!hw_.kernel) {
    const PlanPrice one = price(p, shape);
    return {one, one};
  }
  const PlanOptions po = pricing_options(shape, hw_);
  Entry& e = entry(p);
  std::lock_guard<std::mutex> lock(e.mu);
  PlanPrices out;
  StepEstimate on_areas;
  const StepEstimate est = e.get_builder().price(po, areas_, on_areas, &out.kernels.forwards, &out.areas.forwards);
  ++e.priced;
  out.kernels.step = est.step();
  out.kernels.compute_bound = est.compute_floor;
  out.areas.step = on_areas.step();
  out.areas.compute_bound = on_areas.compute_floor;
  return out;
}

PlanPrice HostPricing::price(Placement p, const PlanShape& shape) { return price_on(p, shape, hw_); }

PlanPrice HostPricing::price_on_areas(Placement p, const PlanShape& shape) {
  return price_on(p, shape, hw_.kernel ? areas_ : hw_);
}

PlanPrice HostPricing::price_on(Placement p, const PlanShape& shape, const HardwareProfile& hw) {
  const PlanOptions po = pricing_options(shape, hw);
  Entry& e = entry(p);
  std::lock_guard<std::mutex> lock(e.mu);
  // Priced, not built: the plan's price sheet.
  PlanPrice out;
  const StepEstimate est = e.get_builder().price(po, &out.forwards);
  ++e.priced;
  out.step = est.step();
  // (Under a kernel model: the plan's compute at the kernels' rates / P,
  // which the step cannot go below; the exact area at peak otherwise.)
  out.compute_bound = est.compute_floor;
  return out;
}

const PlanBuilder* HostPricing::builder_of(const Assignment& a) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Entry& e : entries_)
    if (e.builder && e.grid.get() == a.grid.get() && e.rank == a.rank) return e.builder.get();
  return nullptr;
}

std::size_t HostPricing::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

std::size_t HostPricing::plans_priced() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t n = 0;
  for (const Entry& e : entries_) n += e.priced;
  return n;
}

}  // namespace cpsched
