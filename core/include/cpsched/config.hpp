#pragma once
// Forwarding header, kept until 0.6: the header moved to <cpsched/config/config.hpp> in 0.5.
#include "cpsched/config/config.hpp"
