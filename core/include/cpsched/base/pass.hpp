#pragma once
// The two passes of a training step. A plan has one description per pass,
// and the kernel model and the timing model price each apart.
#include <string_view>

namespace cpsched {

enum class Pass { fwd = 0, bwd = 1 };

inline std::string_view to_string(Pass p) { return p == Pass::fwd ? "fwd" : "bwd"; }

}  // namespace cpsched
