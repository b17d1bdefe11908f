#pragma once
// Forwarding header, kept until 0.6: the header moved to <cpsched/mask/slice_clip.hpp> in 0.5.
#include "cpsched/mask/slice_clip.hpp"
