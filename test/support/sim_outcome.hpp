#pragma once
// A plan run in the sim runtime's numeric mode on virtual ranks, compared with
// the dense single-device reference: the sim tests' one notion of "equal".
#include <sstream>
#include <string>
#include <utility>

#include "cpsched/plan/plan.hpp"
#include "cpsched/problem/problem.hpp"
#include "numeric_check.hpp"
#include "reference.hpp"
#include "virtual_ranks.hpp"

namespace cpsched::test {

// Relative error allowed in O, lse, dQ, dK and dV (fp32 accumulation of bf16
// inputs in another order than the reference's).
constexpr double kTol = 1e-4;

struct Outcome {
  sim::NumericErrors err;
  sim::Faults faults;
  bool passed() const { return faults.empty() && err.max() <= kTol; }
  std::string str() const {
    std::ostringstream s;
    s << "O " << err.o << ", lse " << err.lse << ", dQ " << err.dq << ", dK " << err.dk << ", dV " << err.dv;
    for (const std::string& f : faults.shown()) s << "\n  " << f;
    return s.str();
  }
};

// Inputs from seed 11; `threads` for both the virtual ranks and the reference.
inline Outcome run_numeric(const Problem& p, const Plan& plan, int threads = 2) {
  const sim::GlobalInputs in = sim::GlobalInputs::generate(p, 11);
  sim::VirtualRun run = sim::run_virtual_ranks(p, plan, in, threads);
  return {sim::compare_outputs(run.outputs, sim::dense_reference(p, in, threads)), std::move(run.faults)};
}

}  // namespace cpsched::test
