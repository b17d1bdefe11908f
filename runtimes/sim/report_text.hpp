#pragma once
// The human-readable report and the named figures of a sim run.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cpsched/base/figures.hpp"
#include "cpsched/problem/problem.hpp"
#include "cpsched/hardware/profile.hpp"
#include "numeric_check.hpp"
#include "routing.hpp"
#include "cpsched/timing/stats.hpp"

namespace cpsched::sim {

struct NumericSummary {
  NumericErrors errors;
  double tolerance = 1e-4;
  Faults faults;
  std::int64_t args_run = 0;
  std::int64_t rows_moved = 0;
  std::uint64_t seed = 0;
  double seconds = 0;  // wall time of the virtual ranks and the reference
  bool passed() const { return faults.empty() && errors.max() <= tolerance; }
};

struct ReportInputs {
  const Problem* problem = nullptr;
  int stages = 1;
  std::string mode;
  const HardwareProfile* hardware = nullptr;
  std::optional<NumericSummary> numeric;
  const PassStats* fwd = nullptr;
  const PassStats* bwd = nullptr;
  double compute_bound = 0;  // seconds: compute_bound() of the plan (perfect balance, free communication)
};

std::string report_text(const ReportInputs& in);
Figures report_figures(const ReportInputs& in);

}  // namespace cpsched::sim
