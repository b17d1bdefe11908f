#pragma once
// Forwarding header, kept until 0.6: the header moved to <cpsched/io/atomic_file.hpp> in 0.5.
#include "cpsched/io/atomic_file.hpp"
