#pragma once
// PlanBuilder (DESIGN §3, §7): turns an assignment into the per-rank CalcMeta
// and CommMeta of both passes.
//
// Transfers are token granular: for every (block, head group, computing rank
// != host) exactly the union of the needed rows (QO) or cols (KV) of the tasks
// placed there travels, once, whatever the number of tasks reading it. When
// several ranks need the same rows of a block in the same stage, the sender
// cuts them into one split with several destinations.
//
// Stages. Stage 0 runs the local tasks (q and kv blocks both hosted by the
// computing rank). The remote work is split into `stages` = N stages, each
// with its own group-cast. The rule, per receiving rank and pass:
//  1. its incoming transfers are sorted by bytes to move before compute (the
//     pass's "out" bytes of DESIGN §5), smallest first, ties by (source rank,
//     kind QO before KV, block, group): small transfers arrive first;
//  2. the sorted list is cut into N parts of about equal bytes: a transfer
//     goes to stage 1 + floor(N x bytes_before_it / total_bytes);
//  3. each remote task runs in the first stage where all its data has
//     arrived: the largest stage of its (one or two) transfers.
// So stage 1 carries the smallest transfers and the tasks they unlock, and the
// tasks of stage s never wait for data of a later stage. With N = 1 this is
// the seed's two-stage model (stage 0 local, stage 1 remote). Forward and
// backward use the same rows; their stage cuts may differ because the bytes
// per token differ (backward moves Q, O, dO and lse out).
//
// Attention args: each mask slice of a cell is clipped to the cell exactly
// (cpsched/slice_clip.hpp: up to three slices of the four types) and moved to
// buffer coordinates; a piece whose rows or cols are not contiguous in the
// buffer is cut further.
#include "cpsched/assignment.hpp"
#include "cpsched/plan.hpp"

namespace cpsched {

// Throws cpsched::Error when the assignment is invalid or stages < 1. Builds
// without NDEBUG run validate_plan (plan_validator.hpp) on the result and throw
// its problems.
Plan build_plan(const Assignment& a, int stages = 1);

}  // namespace cpsched
