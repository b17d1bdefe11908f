#include "compare/ilp.hpp"

namespace cpsched::cli {

std::optional<IlpNote> ilp_figures(const Figures& f) {
  const auto total = f.get("total_objective"), inc = f.get("incumbent_bytes"), bound = f.get("bound_bytes"),
             proven = f.get("proven");
  if (!total || !inc || !bound || !proven) return std::nullopt;
  IlpNote n;
  n.total_objective = *total != 0;
  n.proven = *proven != 0;
  n.incumbent_bytes = *inc;
  n.bound_bytes = *bound;
  return n;
}

std::optional<double> gap_to_ilp_pct(double value, std::optional<double> ilp) {
  if (!ilp || *ilp <= 0) return std::nullopt;
  return 100.0 * (value / *ilp - 1.0);
}

}  // namespace cpsched::cli
