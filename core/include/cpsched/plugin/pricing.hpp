#pragma once
// What the host offers a solver that chooses by step time: the timing model
// (timing/model.hpp) on a placement and a plan shape. The host builds and
// times the plans; the solver only says which to price and picks. The host
// keeps what it built, so the plan of the placement the solver returns is
// built once more only in full, from the same transfers and send orders.
//
// Thread safety: add() and the queries may be called from several threads at
// once; queries on one placement are serialised, queries on different ones
// run in parallel. Results never depend on the calling thread or order.
#include <cstddef>
#include <limits>
#include <memory>
#include <vector>

#include "cpsched/plan/shape.hpp"
#include "cpsched/problem/task_grid.hpp"

namespace cpsched {

// Lower bounds (seconds) on the step of every plan of a placement, at any
// stage count (timing/step_bound.hpp).
struct StepBound {
  double plain = 0;    // plans without relays
  double relayed = 0;  // plans with relays
  // With relays on the pricing's node size, could a plan forward anything?
  // False: the relayed plan is the plain one.
  bool may_forward = false;
};

// The timing model's verdict on one plan.
struct PlanPrice {
  double step = std::numeric_limits<double>::infinity();  // seconds, forward + backward
  double compute_bound = 0;  // seconds: all compute / P, which no plan's step is below (under a kernel
                             // model: at the kernels' rates, StepEstimate::compute_floor)
  bool forwards = false;     // the plan has a forwarding phase (relays that relay something)
};

// A plan priced under the profile's kernel model and on exact areas (the
// same profile without its kernel table: every arg's exact area at
// attention_tflops), from the same price sheets: the step the kernels take,
// and the one a planner that knew no kernel model chose on. Equal on a
// profile without a kernel model.
struct PlanPrices {
  PlanPrice kernels;
  PlanPrice areas;  // the plan this shape gives on the profile without its table (its own stage cut)
};

class PlanPricing {
 public:
  using Placement = std::size_t;
  // Registers a placement of `grid`'s tasks; the same grid object and ranks
  // give the same handle. Computes nothing yet.
  virtual Placement add(std::shared_ptr<const TaskGrid> grid, std::vector<Rank> rank) = 0;
  // Its step bounds (the first query computes the placement's transfers).
  virtual StepBound bound(Placement p) = 0;
  // The predicted step of its plan of `shape` (resolved: N >= 1 stages,
  // relays on with a node size or off). Priced from the plan's price sheet
  // (plan/price_sheet.hpp), whose step equals the full plan's.
  virtual PlanPrice price(Placement p, const PlanShape& shape) = 0;
  // bound() on exact areas at attention_tflops: what it gives on the profile
  // without its kernel table (equal to bound() without one).
  virtual StepBound bound_on_areas(Placement p) = 0;
  // price(), and the same shape priced on exact areas (PlanPrices): one more
  // run of the timing model on each sheet, no other plan built.
  virtual PlanPrices price_both(Placement p, const PlanShape& shape) = 0;
  // price() on the profile without its kernel table alone (price_both's
  // areas, at what price() costs without a kernel model).
  virtual PlanPrice price_on_areas(Placement p, const PlanShape& shape) = 0;

 protected:
  ~PlanPricing() = default;
};

}  // namespace cpsched
