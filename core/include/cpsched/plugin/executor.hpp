#pragma once
// Executor: runs a plan (simulated on the CPU, or on GPUs) and reports.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cpsched/base/figures.hpp"
#include "cpsched/problem/assignment.hpp"
#include "cpsched/plan/plan.hpp"

namespace cpsched {

struct ExecuteInput {
  std::shared_ptr<const Problem> problem;
  std::shared_ptr<const TaskGrid> grid;
  const Assignment* assignment = nullptr;
  const Plan* plan = nullptr;
  std::uint64_t seed = 0;  // for generated tensors
};

struct ExecutionReport {
  bool passed = true;                                   // numeric check, if any
  Figures figures;                                      // named figures, in order
  std::string text;                                     // human-readable report
  std::string svg;                                      // optional picture (timeline)
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual ExecutionReport execute(const ExecuteInput& in) = 0;
};

}  // namespace cpsched
