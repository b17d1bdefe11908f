#pragma once
// Forwarding header, kept until 0.6: the header moved to <cpsched/timing/hardware.hpp> in 0.5.
#include "cpsched/timing/hardware.hpp"
