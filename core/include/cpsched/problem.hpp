#pragma once
// Forwarding header, kept until 0.6: the header moved to <cpsched/problem/problem.hpp> in 0.5.
#include "cpsched/problem/problem.hpp"
