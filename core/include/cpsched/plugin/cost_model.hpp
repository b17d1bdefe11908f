#pragma once
// CostModel prices work and data for solvers (DESIGN §4).
//
// Two kinds of model:
//  * abstract (the seed's `area`): compute = area, transfer = tokens x heads;
//    solvers minimise bytes under a balance cap;
//  * time (`time`): seconds on a hardware profile. Compute is FLOPs /
//    throughput, a transfer is bytes / bandwidth of the link class of
//    (src, dst) (inside a node or between nodes), forward and backward both
//    priced, send and receive ports apart. Such a model exposes its prices
//    (`time_prices`) so that a solver can evaluate a placement incrementally,
//    and prices a whole plan with the timing model of the sim (`plan_time`),
//    so that a solver can choose between candidate plans by predicted step
//    time.
#include <optional>

#include "cpsched/base/row_kind.hpp"
#include "cpsched/timing/hardware.hpp"
#include "cpsched/plan/plan.hpp"
#include "cpsched/problem/task_grid.hpp"
#include "cpsched/timing/model.hpp"

namespace cpsched {

// Per-unit prices of a time model (seconds), for incremental evaluation.
struct TimePrices {
  NodeMap nodes;                // which ranks share a node
  double byte_s[2] = {0, 0};    // seconds per byte, one direction of one port: [inside a node, between nodes]
  double latency_s[2] = {0, 0}; // per collective that uses the port
  double flop_s[2] = {0, 0};    // seconds per attention FLOP: [fwd, bwd]
  int link_class(Rank a, Rank b) const { return nodes.link_index(a, b); }
};

class CostModel {
 public:
  virtual ~CostModel() = default;
  // Price of computing task t of grid g (forward + backward for a time model).
  virtual double compute(const TaskGrid& g, TaskId t) const = 0;
  // Price of moving `tokens` tokens with `heads` heads from src to dst (a
  // time model: the seconds of the forward and backward bytes of that kind,
  // out and back, on the link of (src, dst)).
  virtual double transfer(RowKind kind, Token tokens, int heads, Rank src, Rank dst) const = 0;
  // The same with the grid's head geometry (head dim, element size), which a
  // time model needs to count bytes. Solvers call this one.
  virtual double transfer(const TaskGrid&, RowKind kind, Token tokens, int heads, Rank src, Rank dst) const {
    return transfer(kind, tokens, heads, src, dst);
  }

  // Time models only: the unit prices, and the predicted step time of a plan
  // (the sim's timing model on the same hardware profile). Abstract models
  // return nullopt and solvers fall back to bytes.
  virtual std::optional<TimePrices> time_prices() const { return std::nullopt; }
  virtual std::optional<StepEstimate> plan_time(const Problem&, const Plan&) const { return std::nullopt; }
};

// The seed's model: compute = area, transfer = tokens x heads.
class AreaCostModel final : public CostModel {
 public:
  using CostModel::transfer;
  double compute(const TaskGrid& g, TaskId t) const override {
    return static_cast<double>(g.area(t));
  }
  double transfer(RowKind, Token tokens, int heads, Rank, Rank) const override {
    return static_cast<double>(tokens) * heads;
  }
};

// The time model on a hardware profile (the `time` plugin wraps it; solvers
// and tests may use it directly).
class TimeCostModel final : public CostModel {
 public:
  explicit TimeCostModel(HardwareProfile hw);
  const HardwareProfile& hardware() const { return hw_; }
  double compute(const TaskGrid& g, TaskId t) const override;
  // Needs the head geometry: throws cpsched::Error pointing to the grid form.
  double transfer(RowKind kind, Token tokens, int heads, Rank src, Rank dst) const override;
  double transfer(const TaskGrid& g, RowKind kind, Token tokens, int heads, Rank src, Rank dst) const override;
  std::optional<TimePrices> time_prices() const override { return prices_; }
  std::optional<StepEstimate> plan_time(const Problem& p, const Plan& plan) const override {
    return estimate_step(p, plan, hw_);
  }

 private:
  HardwareProfile hw_;
  TimePrices prices_;
};

}  // namespace cpsched
