#pragma once
// Forwarding header, kept until 0.6: the bound moved to <cpsched/timing/step_bound.hpp> in 0.5.
#include "cpsched/timing/step_bound.hpp"

namespace cpsched::search {
using cpsched::StepBound;
using cpsched::step_lower_bound;
}  // namespace cpsched::search
