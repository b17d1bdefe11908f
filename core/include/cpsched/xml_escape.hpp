#pragma once
// Forwarding header, kept until 0.6: the header moved to <cpsched/io/xml_escape.hpp> in 0.5.
#include "cpsched/io/xml_escape.hpp"
