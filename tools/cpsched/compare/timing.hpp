#pragma once
// Simulated step time for `cpsched compare`: runs a plan through the timing
// executor (the `sim` plugin in timing mode with a hardware profile) and
// reads its figures by name.
#include <memory>
#include <string>

#include "compare/sweep.hpp"
#include "cpsched/plugin/executor.hpp"

namespace cpsched::cli {

class TimingRunner {
 public:
  TimingRunner(std::unique_ptr<Executor> exec, std::string label) : exec_(std::move(exec)), label_(std::move(label)) {}
  const std::string& label() const { return label_; }
  // Fills the timing figures of `f`; false (with `why`) when the executor
  // failed or did not report them.
  bool measure(const std::shared_ptr<const Problem>& problem, const Assignment& a, const Plan& plan,
               CompareFigures& f, std::string& why);

 private:
  std::unique_ptr<Executor> exec_;
  std::string label_;
};

// The timing executor on one profile of the hardware axis (`hardware`: what
// its `hardware` parameter gets; `label`: the profile as given). nullptr with `why` when the executor plugin is
// not installed; a parameter or hardware-profile error is thrown (the config
// is wrong, not the install).
std::unique_ptr<TimingRunner> make_timing_runner(const CompareSpec& spec, const std::string& hardware,
                                                 const std::string& label, const Registry& reg, const ConfigLoader& load, std::string& why);

}  // namespace cpsched::cli
