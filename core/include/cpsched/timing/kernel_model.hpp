#pragma once
// Forwarding header, kept until 0.7: the header moved to <cpsched/hardware/kernel_model.hpp> in 0.6.
#include "cpsched/hardware/kernel_model.hpp"
