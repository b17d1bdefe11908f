#pragma once
// Forwarding header, kept until 0.6: the header moved to <cpsched/hardware/profile.hpp> in 0.5.
#include "cpsched/hardware/profile.hpp"
