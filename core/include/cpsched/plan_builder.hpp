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

// Relays (two-level collectives, opt-in; plan.hpp describes the forwarding
// phase). With relay_node_size = n >= 2 ranks r and t share a node when
// r / n == t / n. For every stage, kind, source s and split with receivers D
// (after the cut above), every node B != node(s) with at least two receivers
// in D gets the split once, at a relay t of D in B, which forwards it to the
// others of D in B. The relay is the receiver of D in B with the fewest bytes
// received from other nodes so far in the pass (first-phase bytes at the
// pass's bytes per token, splits visited in emission order), ties by rank:
// deterministic, and it spreads the NIC load over the node's ranks. The same
// rows reach the same ranks and the args read them where they land, so the
// placement, the loads and the total bytes sent are unchanged; only who sends
// and over which link changes. Backward uses the forward's bytes per token for
// the choice when both passes share the stage cut (the description is shared).
struct PlanOptions {
  int stages = 1;           // remote stages N >= 1
  int relay_node_size = 0;  // ranks per node for relays; 0 or 1: no relays (default)
};

// Throws cpsched::Error when the assignment is invalid, stages < 1 or
// relay_node_size < 0. Builds without NDEBUG run validate_plan
// (plan_validator.hpp) on the result and throw its problems.
Plan build_plan(const Assignment& a, const PlanOptions& options);
inline Plan build_plan(const Assignment& a, int stages = 1) { return build_plan(a, PlanOptions{stages, 0}); }

}  // namespace cpsched
