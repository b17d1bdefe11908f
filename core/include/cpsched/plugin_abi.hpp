#pragma once
// Forwarding header, kept until 0.6: the header moved to <cpsched/plugin/abi.hpp> in 0.5.
#include "cpsched/plugin/abi.hpp"
