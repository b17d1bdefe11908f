#pragma once
// CostModel: what a cost-model plugin provides. Two things, apart:
//  * per-task prices, for solvers that price tasks one by one (the seed's
//    binary_greedy): compute(task) and transfer(rows); the `area` model's
//    are the seed's (compute = area, transfer = tokens x heads), the `time`
//    model's are seconds;
//  * for a time model, the cluster it prices: hardware(). The host derives
//    the unit prices (TimePrices, below) from it, and prices whole plans on it
//    with its timing model (pricing.hpp): solvers never time plans themselves.
// The bundled `area` and `time` models are built into the host (the registry
// lists them as built-in); a plugin may add others.
#include <memory>
#include <optional>

#include "cpsched/base/row_kind.hpp"
#include "cpsched/problem/task_grid.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/hardware/node_map.hpp"

namespace cpsched {

// Unit prices of a time model (seconds), for incremental evaluation.
struct TimePrices {
  NodeMap nodes;                // which ranks share a node
  double byte_s[2] = {0, 0};    // seconds per byte, one direction of one port: [inside a node, between nodes]
  double latency_s[2] = {0, 0}; // per collective that uses the port
  double flop_s[2] = {0, 0};    // seconds per attention FLOP: [fwd, bwd]
  // The profile when it has a kernel model (hardware/kernel_model.hpp): a
  // task's compute is then its args' kernel seconds (hardware/task_kernel.hpp),
  // not area x q heads x FLOPs per pair x flop_s. Null otherwise.
  std::shared_ptr<const HardwareProfile> kernel;
  int link_class(Rank a, Rank b) const { return nodes.link_index(a, b); }
};
// The unit prices of a hardware profile.
TimePrices time_prices(const HardwareProfile& hw);

class CostModel {
 public:
  virtual ~CostModel() = default;
  // Price of computing task t of grid g (forward + backward for a time model).
  virtual double compute(const TaskGrid& g, TaskId t) const = 0;
  // Price of moving `tokens` rows of `kind` with `heads` heads from src to
  // dst (a time model: the seconds of the forward and backward bytes of that
  // kind, out and back, on the link of (src, dst)).
  virtual double transfer(const TaskGrid& g, RowKind kind, Token tokens, int heads, Rank src, Rank dst) const = 0;
  // A time model: the cluster whose time it prices. Null for abstract models.
  virtual const HardwareProfile* hardware() const { return nullptr; }
};

// The seed's model: compute = area, transfer = tokens x heads.
class AreaCostModel final : public CostModel {
 public:
  double compute(const TaskGrid& g, TaskId t) const override { return static_cast<double>(g.area(t)); }
  double transfer(const TaskGrid&, RowKind, Token tokens, int heads, Rank, Rank) const override {
    return static_cast<double>(tokens) * heads;
  }
};

// Seconds on a hardware profile (with its kernel model, a task's compute is
// its args' kernel seconds).
class TimeCostModel final : public CostModel {
 public:
  explicit TimeCostModel(HardwareProfile hw);
  double compute(const TaskGrid& g, TaskId t) const override;
  double transfer(const TaskGrid& g, RowKind kind, Token tokens, int heads, Rank src, Rank dst) const override;
  const HardwareProfile* hardware() const override { return &hw_; }

 private:
  HardwareProfile hw_;
  TimePrices prices_;
};

}  // namespace cpsched
