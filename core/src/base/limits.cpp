#include "cpsched/base/limits.hpp"

#include <fmt/format.h>


namespace cpsched {

namespace {

std::string pow2(std::int64_t v) {
  for (int e = 0; e < 63; ++e)
    if (v == std::int64_t{1} << e) return fmt::format("2^{}", e);
  return fmt::format("{}", v);
}

std::string wide(__int128 v) {
  if (v <= std::numeric_limits<std::int64_t>::max()) return fmt::format("{}", static_cast<std::int64_t>(v));
  return fmt::format("{:.3g}", static_cast<double>(v));
}

}  // namespace

void check_at_most(const char* key, const char* what, __int128 value, std::int64_t limit, const char* hint) {
  if (value > limit)
    throw LimitError(key, fmt::format("problem.{}: {} = {} exceeds the limit {}{}", key, what, wide(value),
                                      pow2(limit), hint));
}

std::int64_t checked_int64(__int128 v, const char* what) {
  if (v > std::numeric_limits<std::int64_t>::max() || v < std::numeric_limits<std::int64_t>::min())
    throw Error(fmt::format("{}: {} does not fit in 64 bits (the problem is outside the limits of "
                            "cpsched/limits.hpp)",
                            what, wide(v)));
  return static_cast<std::int64_t>(v);
}

void check_size_limits(Token seqlen, std::int64_t cp_size, std::int64_t blocks_per_rank) {
  using namespace limits;
  check_at_most("cp_size", "P", cp_size, kMaxRanks);
  check_at_most("seqlen_per_rank", "S (cp_size x seqlen_per_rank)", seqlen, kMaxSeqlen);
  check_at_most("grid.blocks_per_rank", "blocks_per_rank", blocks_per_rank, kMaxBlocksPerRank);
  check_at_most("grid.blocks_per_rank", "blocks (cp_size x blocks_per_rank)", __int128{cp_size} * blocks_per_rank,
          kMaxBlocks);
}

}  // namespace cpsched
