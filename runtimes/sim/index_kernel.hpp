#pragma once
// CPU attention over one index arg (token top-k masks, plan.hpp): query row
// i of the arg attends to the kv-view rows listed in its index row, -1
// skipped. The same math as attention_kernel.hpp (scale 1/sqrt(d_qk), lse,
// GQA and MLA head geometry), gathered row by row instead of tiled: the
// selections are scattered, and the simulator's job is to be exact.
#include <cstdint>

#include "attention_kernel.hpp"

namespace cpsched::sim {

struct IndexRows {
  const std::int32_t* keys = nullptr;  // [rows x width], view rows of k / v
  std::int32_t width = 0;
};

// Rows `q_rows` of the q view; the result's row r is q_rows.begin + r.
Partial attention_forward_index(const KernelShape& shape, CView q, CView k, CView v, Range q_rows, IndexRows idx,
                                int threads = 1);

// Gradients accumulate (+=) like attention_backward. Deterministic for any
// thread count (work is split by kv head: each writes its own dK / dV heads).
void attention_backward_index(const KernelShape& shape, const BackwardInputs& in, const BackwardOutputs& out,
                              Range q_rows, IndexRows idx, int threads = 1);

}  // namespace cpsched::sim
