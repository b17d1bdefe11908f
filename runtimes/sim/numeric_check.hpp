#pragma once
// Comparison of the virtual ranks' outputs with the dense reference: for each
// tensor the largest absolute difference over the largest absolute reference
// value (lse: over finite entries; a row empty in one and not in the other,
// or a NaN anywhere, is an infinite error).
#include "global_tensors.hpp"

namespace cpsched::sim {

struct NumericErrors {
  double o = 0, lse = 0, dq = 0, dk = 0, dv = 0;
  double max() const;
};

NumericErrors compare_outputs(const GlobalOutputs& got, const GlobalOutputs& ref);

}  // namespace cpsched::sim
