#pragma once
// The reference placements the portfolio starts from (and that the `ilp`
// solver offers as incumbents): the same rules as the `owner` and `usp`
// plugins, reimplemented because a plugin does not load plugins.
#include <vector>

#include <cpsched/problem/task_grid.hpp>

namespace cpsched::search {

// Every task on its q block's host (KV-only communication).
std::vector<Rank> owner_placement(const TaskGrid& grid);

// Ulysses x ring: task (q block hosted by h, head group g) on rank
// (h / u) * u + g * u / G with u = usp_ulysses_degree(P, hkv, max_degree).
// Empty when head groups are not flattened (Ulysses splits heads).
std::vector<Rank> usp_placement(const TaskGrid& grid, int max_degree);

// Per q block, the owner's or usp's placement of all its tasks, whichever
// loads the busiest port less: owner brings every head group's remote KV to
// the host (one port), usp spreads the groups over the host's Ulysses group
// of ranks, each receiving its group's Q rows and remote KV. Seconds per byte
// by link class from `byte_s` (inside a node, between nodes; nodes of
// `gpus_per_node` ranks), forward + backward bytes. Long documents cut across
// ranks (much remote KV per row) spread; short ones stay home. Empty when
// head groups are not flattened.
std::vector<Rank> hybrid_placement(const TaskGrid& grid, int max_degree, const double byte_s[2], int gpus_per_node);

// Balance cap of docs/design.md#metrics: a rank may carry at most mu x mean load.
std::int64_t balance_cap(const TaskGrid& grid, double mu);

}  // namespace cpsched::search
