#pragma once
// Seeded test tensors and their placement. Every value is a pure function of
// (seed, tensor, global element index): uniform in [-1, 1), rounded to bf16,
// so a rank generates only its own shard and the reference (fp32 tensors of
// the whole sequence for the sim runtime) sees exactly the same numbers.
#include <cstdint>

#include "cpsched/problem/problem.hpp"
#include "global_tensors.hpp"
#include "pipeline.hpp"

namespace cpsched::gpu {

enum class InputTensor : std::uint64_t { q = 1, k = 2, v = 3, d_o = 4 };

float input_value(std::uint64_t seed, InputTensor t, std::uint64_t index);

// Rank r's shard of Q, K, V, dO under `sh` (its blocks in block order).
RankInputs shard_inputs(const Problem& p, const Sharding& sh, Rank r, std::uint64_t seed);

// The same values over the whole sequence, fp32, in the sim runtime's layout.
sim::GlobalInputs global_inputs(const Problem& p, std::uint64_t seed);

// Copies rank r's outputs to their global tokens (outputs sized with
// sim::GlobalOutputs::like).
void place_outputs(const Sharding& sh, Rank r, const HeadLayout& h, const RankOutputs& out, sim::GlobalOutputs& g);

}  // namespace cpsched::gpu
