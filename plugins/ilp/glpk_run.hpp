#pragma once
// Runs GLPK on a model: the LP relaxation (simplex), then branch and cut, with
// one time limit for both, an optional incumbent offered at the first
// heuristic call, and the proven bound tracked from the search tree. GLPK's
// fatal errors are caught (error hook) and reported instead of aborting.
#include <limits>
#include <string>
#include <vector>

struct glp_prob;

namespace cpsched::ilp {

struct RunOptions {
  double time_limit_s = 30.0;
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
