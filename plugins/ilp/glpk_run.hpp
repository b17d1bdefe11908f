#pragma once
// Runs GLPK on a model: the LP relaxation (simplex), then branch and cut,
// both inside one deadline, an optional incumbent offered at the first
// heuristic call, and the proven bound tracked from the search tree. GLPK's
// fatal errors are caught (error hook) and reported instead of aborting.
//
// The deadline is a point on the steady clock shared by every run of a solve:
// a run may use `share` of the time left when it starts. GLPK's own tm_lim is
// set from it, and the branch-and-cut callback also stops the search
// (glp_ios_terminate) once the clock passes the run's end, since GLPK checks
// tm_lim only between nodes and a root node's cut rounds can run past it.
#include <chrono>
#include <limits>
#include <string>
#include <vector>

struct glp_prob;

namespace cpsched::ilp {

struct RunOptions {
  std::chrono::steady_clock::time_point deadline;  // of the whole solve
  double share = 1.0;                              // of the time left that this run may use, (0, 1]
  double mip_gap = 0.0;
  const std::vector<double>* warm = nullptr;  // 1-based column values
};

struct RunResult {
  bool ok = true;                // false: GLPK failed (see error)
  std::string error;
  bool lp_solved = false;        // the LP relaxation was solved to optimality
  double root_bound = -std::numeric_limits<double>::infinity();
  double bound = -std::numeric_limits<double>::infinity();  // proven lower bound
  bool has_incumbent = false;
  bool optimal = false;          // proven within mip_gap
  double incumbent = std::numeric_limits<double>::infinity();
  std::vector<double> cols;      // incumbent's column values, 1-based
  bool warm_accepted = false;
  bool time_limit_hit = false;
  bool infeasible = false;       // proven: no solution meets the constraints
  double seconds = 0;
};

RunResult run_glpk(glp_prob* lp, const RunOptions& o);

}  // namespace cpsched::ilp
