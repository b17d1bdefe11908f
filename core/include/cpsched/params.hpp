#pragma once
// Forwarding header, kept until 0.6: the header moved to <cpsched/plugin/params.hpp> in 0.5.
#include "cpsched/plugin/params.hpp"
