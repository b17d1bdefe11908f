#pragma once
// Forwarding header, kept until 0.6: the header moved to <cpsched/mask/index/index_mask.hpp> in 0.5.
#include "cpsched/mask/index/index_mask.hpp"
