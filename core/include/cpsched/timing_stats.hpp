#pragma once
// Forwarding header, kept until 0.6: the header moved to <cpsched/timing/stats.hpp> in 0.5.
#include "cpsched/timing/stats.hpp"
