#pragma once
// Forwarding header, kept until 0.6: the header moved to <cpsched/base/limits.hpp> in 0.5, and the checks
// of a whole problem to <cpsched/problem/limits.hpp>.
#include "cpsched/base/limits.hpp"
#include "cpsched/problem/limits.hpp"
