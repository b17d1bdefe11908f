#pragma once
// The CPU twin of one cuDNN SDPA call (host/plan/sdpa_batches.hpp): the same
// ragged (THD) batch semantics, executed on host memory, so the emulate
// backend runs the pipeline's cuDNN path and the CPU tests check the arg ->
// batch translation against the dense reference.
//
// What it reproduces of cuDNN (docs/operations/Attention.md of the frontend):
// per sequence b, seq_q[b] query rows at q + q_off[b] (rows q_row_heads * d
// elements apart) and seq_k[b] keys at k / v + k_off[b]; GQA (q head h reads
// kv head h / (q_heads / kv_heads)); the mask from the geometry's form
// (BOTTOM_RIGHT shifts the diagonal by seq_k - seq_q; the right bound masks
// cols beyond row + right, the left bound cols at or before row - left);
// softmax in fp32 with the scale; O in bf16 and the stats (natural-log LSE,
// fp32) at the packed offsets. Backward: dQ, dK, dV in bf16 from the given O,
// dO (in place) and stats (packed), delta = rowsum(dO * O) computed inside, as
// cuDNN does.
//
// A query row that no key reaches gets NaN in O and its stats: cuDNN does not
// document that case, so the translation must never produce one, and a test
// that did would fail on the NaN.
#include "host/plan/sdpa_batches.hpp"

namespace cpsched::gpu {

// Throws cpsched::Error when a sequence exceeds the geometry (as cuDNN would fail).
void sdpa_twin(const SdpaGeometry& g, const SdpaBind& b);

}  // namespace cpsched::gpu
