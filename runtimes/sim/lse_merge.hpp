#pragma once
// The lse-weighted merge of partial attention outputs (docs/plan_format.md):
//   lse = log(sum_i exp(lse_i)),  O = sum_i exp(lse_i - lse) O_i.
// A partial with lse = -inf (no unmasked entry) contributes nothing; merging
// two such rows keeps lse = -inf and O = 0.
#include "cpsched/base/range.hpp"
#include "tensor_view.hpp"

namespace cpsched::sim {

// Merges one (o, lse) row-head pair into the accumulator (o has dim floats).
void merge_one(float* acc_o, float& acc_lse, const float* o, float lse, int dim);

// Merges rows [0, rows) x heads of (o, lse) into the accumulator rows [0, rows).
// lse views have one float per head.
void merge_rows(MView acc_o, MView acc_lse, CView o, CView lse, Token rows, int heads, int dim);

// acc += src over rows [0, rows) x width floats (the sum reduce of dQ, dK, dV).
void add_rows(MView acc, CView src, Token rows, std::int64_t width);

}  // namespace cpsched::sim
