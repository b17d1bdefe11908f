#pragma once
// Forwarding header, kept until 0.7: the header moved to <cpsched/hardware/task_kernel.hpp> in 0.6.
#include "cpsched/hardware/task_kernel.hpp"
