#pragma once
// The limits a whole problem is checked against (Problem::validate, in this
// order); the constants and the size checks are base/limits.hpp's.
#include "cpsched/base/limits.hpp"

namespace cpsched {

struct Problem;

// The size checks, plus heads, D, b and the slice count. Throws LimitError.
void check_shape_limits(const Problem& p);
// Total load and traffic bound, in 128-bit; needs a validated mask (slices
// inside [0, S)). Throws LimitError.
void check_load_limits(const Problem& p);

// The bound of any byte figure: P x S x (bytes per token of all heads, the
// larger pass, both directions), in 128-bit.
__int128 traffic_bound_bytes(const Problem& p);

}  // namespace cpsched
