#pragma once
// Forwarding header, kept until 0.6: the header moved to <cpsched/timing/model.hpp> in 0.5.
#include "cpsched/timing/model.hpp"
