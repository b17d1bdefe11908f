#pragma once
// CostModel prices work and data for solvers (DESIGN §4).
#include "cpsched/task_grid.hpp"

namespace cpsched {

enum class TransferKind : int { qo = 0, kv = 1 };

class CostModel {
 public:
  virtual ~CostModel() = default;
  // Price of computing task t of grid g.
  virtual double compute(const TaskGrid& g, TaskId t) const = 0;
  // Price of moving `tokens` tokens with `heads` heads from src to dst.
  virtual double transfer(TransferKind kind, Token tokens, int heads, Rank src, Rank dst) const = 0;
};

// The seed's model: compute = area, transfer = tokens x heads.
class AreaCostModel final : public CostModel {
 public:
  double compute(const TaskGrid& g, TaskId t) const override {
    return static_cast<double>(g.area(t));
  }
  double transfer(TransferKind, Token tokens, int heads, Rank, Rank) const override {
    return static_cast<double>(tokens) * heads;
  }
};

}  // namespace cpsched
