#pragma once
// Forwarding header, kept until 0.6: the header moved to <cpsched/mask/mask.hpp> in 0.5.
#include "cpsched/mask/mask.hpp"
