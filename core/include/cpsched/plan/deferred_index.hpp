#pragma once
// The index rows of a plan whose executor writes them (a rank's plan from
// top-k row runs, CalcMeta::deferred_index_entries): what the plan builder
// would have written, computed from the rank's own rows where they are. A
// GPU executor does this on the device (cpsched.torch); this host version is
// the reference and serves host executors.
#include <cstdint>
#include <vector>

#include "cpsched/mask/index/summary.hpp"
#include "cpsched/plan/plan.hpp"

namespace cpsched {

// The pool of one pass of rank `rank`'s plan (`deferred_index_entries`
// entries) from the rank's own top-k rows: per index arg and query row, the
// row's keys inside the arg's key block, ascending, as rows of the arg's k
// buffer (the local shard, or the remote KV buffer by
// CommMeta::remote_kv_rows), -1 padded to index_width. Throws cpsched::Error
// when a key is in no buffer row or a row has more keys than index_width
// (rows that are not those the plan was made from).
std::vector<std::int32_t> write_deferred_index_rows(const PassPlan& pass, const Sharding& sharding, Rank rank,
                                                    const TopkRows& own);

}  // namespace cpsched
