#pragma once
// Which buffer an arg's rows index on a rank: its own shard (its blocks in
// block order) or its remote buffer of that kind, the rows received in casts
// (plan/plan.hpp). The kernel model counts one call per pair of buffers.
#include <cstdint>

namespace cpsched {

enum class BufferId : std::uint8_t { local = 0, remote = 1 };

}  // namespace cpsched
