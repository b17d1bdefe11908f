#pragma once
// Forwarding header, kept until 0.6: the header moved to <cpsched/io/npy_array.hpp> in 0.5.
#include "cpsched/io/npy_array.hpp"
