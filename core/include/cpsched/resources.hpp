#pragma once
// Forwarding header, kept until 0.6: the header moved to <cpsched/base/resources.hpp> in 0.5.
#include "cpsched/base/resources.hpp"
