#pragma once
// Forwarding header, kept until 0.6: the header moved to <cpsched/plan/plan.hpp> in 0.5.
#include "cpsched/plan/plan.hpp"
