#pragma once
// What `cpsched compare` reads from the `ilp` solver: its proven bound and
// whether it proved its placement optimal, from its figures
// (plugins/ilp/ilp_solver.cpp: total_objective, incumbent_bytes, bound_bytes,
// proven).
#include <optional>
#include <string>

#include "cpsched/base/figures.hpp"

namespace cpsched::cli {

struct IlpNote {
  bool total_objective = false;  // objective `total`: the bound bounds the forward total send
  bool proven = false;           // the incumbent is proven optimal
  double incumbent_bytes = 0;
  double bound_bytes = 0;
};

// nullopt when the figures lack them (another solver, or no placement met
// the balance cap).
std::optional<IlpNote> ilp_figures(const Figures& figures);

// The solver whose forward send the "gap to ilp" columns compare with.
inline constexpr const char* kIlpSolver = "ilp";

// 100 x (value / ilp - 1): how many percent more forward bytes than ilp.
std::optional<double> gap_to_ilp_pct(double value, std::optional<double> ilp);

}  // namespace cpsched::cli
