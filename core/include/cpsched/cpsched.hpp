#pragma once
// Forwarding header, kept until 0.6: the header moved to <cpsched/session/session.hpp> in 0.5.
#include "cpsched/session/session.hpp"
