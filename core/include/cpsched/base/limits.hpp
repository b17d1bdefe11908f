#pragma once
// The sizes cpsched accepts, in the terms of docs/design.md#vocabulary. Inside them every area,
// load, byte count and index the library computes fits its integer type:
// Problem::validate() checks them (check_limits below) before anything is
// built, and each error names the offending value and the key to change.
//
//   P  <= 2^20 ranks                 S <= 2^40 tokens
//   c  <= 2^16 blocks per rank       P * c <= 2^24 blocks
//   hq, hkv <= 2^16 heads            D <= 2^16, b <= 16 bytes
//   slices <= 2^31 - 1               tasks (cells x head groups) <= 2^31 - 1 (TaskId is 32-bit)
//   total load = mask area x hq <= 2^62, so every area and load, any sum of
//     them and mu x total (mu <= 2) fit in int64;
//   traffic bound = P x S x bytes per token of all heads <= 2^62, which bounds
//     every byte figure of the metrics and of the plan.
// What fits these limits may still not fit the machine: resources.hpp
// estimates memory before the work.
#include <cstdint>
#include <limits>
#include <string>

#include "cpsched/base/error.hpp"
#include "cpsched/base/range.hpp"

namespace cpsched {


namespace limits {
inline constexpr std::int64_t kMaxRanks = std::int64_t{1} << 20;
inline constexpr std::int64_t kMaxSeqlen = std::int64_t{1} << 40;
inline constexpr std::int64_t kMaxBlocksPerRank = std::int64_t{1} << 16;
inline constexpr std::int64_t kMaxBlocks = std::int64_t{1} << 24;
inline constexpr std::int64_t kMaxHeads = std::int64_t{1} << 16;
inline constexpr std::int64_t kMaxHeadDim = std::int64_t{1} << 16;
inline constexpr std::int64_t kMaxDtypeBytes = 16;
inline constexpr std::int64_t kMaxSlices = std::numeric_limits<std::int32_t>::max();
inline constexpr std::int64_t kMaxTasks = std::numeric_limits<std::int32_t>::max();
inline constexpr std::int64_t kMaxLoad = std::int64_t{1} << 62;
inline constexpr std::int64_t kMaxTrafficBytes = std::int64_t{1} << 62;
}  // namespace limits

// A broken limit. `key` is the configuration key under `problem.` that sets
// the value (e.g. "grid.blocks_per_rank", "seqlen_per_rank", "mask"), so a
// config reader can point at it; the message names it too.
class LimitError : public Error {
 public:
  LimitError(std::string key, const std::string& what) : Error(what), key_(std::move(key)) {}
  const std::string& key() const { return key_; }

 private:
  std::string key_;
};

// P, S, blocks_per_rank and P x c (before a sharding is built); the checks
// of a whole problem are problem/limits.hpp's. Throws LimitError.
void check_size_limits(Token seqlen, std::int64_t cp_size, std::int64_t blocks_per_rank);

// Throws LimitError (key `key`, "problem.<key>: <what> = <value> exceeds the
// limit ...<hint>") when value > limit.
void check_at_most(const char* key, const char* what, __int128 value, std::int64_t limit, const char* hint = "");

// Narrows a 128-bit value known to fit, or throws Error naming `what`.
std::int64_t checked_int64(__int128 v, const char* what);

}  // namespace cpsched
