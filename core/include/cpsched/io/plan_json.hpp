#pragma once
// Plan export as JSON (docs/plan_format.md; format "cpsched-plan/1", documented in
// docs/plan_format.md): problem, solver, tasks, metrics and, with a plan, the
// per-rank CalcMeta and CommMeta of both passes.
#include <ostream>
#include <string>

#include "cpsched/problem/assignment.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/plugin/params.hpp"
#include "cpsched/plan/plan.hpp"

namespace cpsched {

struct PlanExport {
  const Assignment* assignment = nullptr;  // required
  const Metrics* metrics = nullptr;        // required
  const Plan* plan = nullptr;              // optional: without it, no "ranks" part
  std::string solver;                      // solver name
  Params solver_params;                    // resolved parameters
  double solve_ms = 0.0;
  bool feasible = true;                    // the solver's balance target was met
  std::string note;                        // the solver's remark
  bool include_tasks = true;               // the "tasks" list (one entry per task)
  // The index args' pools ("indices"): false for a reader that takes them
  // another way (a rank's own, as an array: the pools of a DSA layer are
  // millions of entries per rank).
  bool include_index_rows = true;
};

// indent < 0: compact, one line. Throws cpsched::Error when a required pointer is null.
void write_plan_json(std::ostream& out, const PlanExport& e, int indent = -1);
std::string plan_json(const PlanExport& e, int indent = -1);

}  // namespace cpsched
