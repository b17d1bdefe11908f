#pragma once
// Forwarding header, kept until 0.6: the header moved to <cpsched/timing/hardware.hpp> in 0.5 and to
// <cpsched/hardware/profile.hpp> since.
#include "cpsched/hardware/profile.hpp"
