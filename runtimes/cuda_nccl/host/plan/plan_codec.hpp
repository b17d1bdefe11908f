#pragma once
// A RankPlan as bytes, for plan_source = broadcast: rank 0 solves and sends
// every rank its own plan. Native byte order (all ranks of a job share one
// architecture), with a magic word and a version so a foreign blob fails
// with a message instead of garbage.
#include <cstdint>
#include <vector>

#include "cpsched/plan/plan.hpp"

namespace cpsched::gpu {

std::vector<std::uint8_t> encode_rank_plan(const RankPlan& p, int num_stages);
// Throws cpsched::Error on a truncated or foreign blob.
RankPlan decode_rank_plan(const std::vector<std::uint8_t>& bytes, int* num_stages = nullptr);

}  // namespace cpsched::gpu
