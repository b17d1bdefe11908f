#pragma once
// Forwarding header, kept until 0.6: the estimates moved to
// <cpsched/problem/resources.hpp> and the budget to <cpsched/base/memory_budget.hpp>.
#include "cpsched/problem/resources.hpp"
