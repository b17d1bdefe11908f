#pragma once
// Plan validator (docs/plan_format.md): checks a plan against the assignment it was
// built from and returns every problem found as a precise sentence (rank,
// pass, stage, split or arg index, the numbers at fault). Empty = valid.
//
// Checks, for both passes:
//  * shape: one RankPlan per rank, N remote stages everywhere, parallel
//    vectors of equal length, positive split sizes, groups in range, dsts
//    sorted, in range and never the sender, the plan's sharding is the grid's;
//  * send/receive agreement to the token: rank r's output splits from source s
//    are s's input splits that name r, same order, sizes and groups; output
//    splits ordered by source; token counts and receive offsets add up;
//  * every range inside its buffer: input splits inside the local shard; args
//    inside the local shard or inside the remote buffer received up to their
//    stage; stage-0 args read local buffers only; remote rows hold the arg's
//    head group;
//  * exactly-once coverage, by exact area accounting (index masks: pair by
//    pair, in chunks of query rows, in memory bounded by the budget): every arg is mapped back
//    to global coordinates and cut per grid cell; per (cell, head group) the
//    pieces lie inside the mask, do not overlap each other, add up to the
//    cell's area, and run on the rank the assignment chose; no piece falls in
//    an empty cell;
//  * nothing travels for nothing: every received row is read by some arg;
//  * metrics: send/recv bytes per rank (docs/design.md#metrics) recomputed from the
//    CommMeta, loads and stage-0 loads recomputed from the CalcMeta, and the
//    remote token counts equal compute_metrics(assignment); the reduce_after
//    fields equal the last stage reading each stage's rows.
#include <cstddef>
#include <string>
#include <vector>

#include "cpsched/problem/assignment.hpp"
#include "cpsched/plan/plan.hpp"
#include "cpsched/plan/solve_result.hpp"

namespace cpsched {

struct ValidateOptions {
  bool check_metrics = true;
  std::size_t max_problems = 100;  // the list stops there (with a final "... more" line)
  // Index masks: the computed pairs are checked in chunks of query rows of
  // at most this many selected pairs (0: validator_chunk_bytes of the memory
  // budget, resources.hpp), so the validator's memory stays bounded.
  std::size_t index_chunk_pairs = 0;
};

// A rank's plan (Plan::only_rank >= 0: one entry, as each rank builds its
// own) is not a whole plan: validate_plan says so in one problem and checks
// nothing else; validate_rank_plan checks it.
std::vector<std::string> validate_plan(const Assignment& a, const Plan& plan, const ValidateOptions& opt = {});

// Rank r's plan (Plan::only_rank = r) validated as r's part of the whole:
// `peers` is what the other ranks run with it, every rank's CommMeta of the
// same assignment and options (build_plan with PlanOptions::rank = r and
// peers_comm; their CalcMeta may be empty, the problem may hold r's index
// rows only). Rank r's entry takes its place among them and the checks above
// run with every rank's CommMeta (shape, send/receive agreement, relays,
// bytes per rank) and rank r's CalcMeta: its args inside their buffers, every
// pair of the tasks placed on r computed exactly once by r and nothing of
// another rank's, its received rows all read, each reduce_after at or after
// r's last stage reading the rows, and its loads the metrics'. An index plan
// whose rows the executor writes (CalcMeta::deferred_index_entries) has its
// pairs counted by index_area, not read. The other entries of `plan` must be
// empty.
std::vector<std::string> validate_rank_plan(const Assignment& a, const Plan& plan, Plan peers,
                                            const ValidateOptions& opt = {});

// A solve's plan: validate_plan, or for a rank's plan validate_rank_plan
// against its peers built from the result's assignment, shape and hardware
// (SolveResult::hardware, the profile the plan was built on).
std::vector<std::string> validate_result(const SolveResult& r, const ValidateOptions& opt = {});

// Brute force for small problems (tests): evaluates every arg entry by entry,
// maps it to global coordinates and counts, per head group, how often each
// (q, k) entry is computed; returns a problem for each entry of the mask not
// computed exactly once and each masked entry computed. O(G x S^2 + total
// arg area); throws cpsched::Error when G x S^2 exceeds 2^26. Assumes the
// comm agreement that validate_plan checks (receive buffers are described by
// the senders' input splits).
std::vector<std::string> brute_force_plan_coverage(const Assignment& a, const Plan& plan,
                                                   std::size_t max_problems = 20);

}  // namespace cpsched
