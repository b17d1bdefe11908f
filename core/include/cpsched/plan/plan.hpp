#pragma once
// The execution plan an executor consumes (docs/plan_format.md): per rank and pass, the
// attention args of each stage (CalcMeta) and the group collectives that move
// the data they need (CommMeta). Stage 0 is local; stages 1..N are remote.
//
// Buffers of rank r (all in tokens; a "row" of a buffer is one token):
//  * local: r's shard, the concatenation of its blocks in block order
//    (Sharding::rank_tokens(r) with RangeSet::to_local), all heads.
//  * remote QO / remote KV: the concatenation of the receive buffers of stages
//    1..N in stage order; stage s's QO receive buffer starts at
//    `StageComm::qo_recv_offset` and is the concatenation of its output splits
//    in order (likewise KV). A remote row holds only the heads of its split's
//    head group. Remote args of stage s read only rows of stages 1..s, so the
//    receive buffers of earlier stages stay alive until the pass ends.
//
// Execution of one pass on rank r (forward; backward moves other tensors over
// the same description, see GroupCollectiveArg):
//   launch group-cast of stage 1; compute local_attn_args (stage 0);
//   for s = 1..N: wait stage s data; launch group-cast of stage s+1;
//                 compute remote_attn_args[s-1];
//   group-reduce the outputs of every stage s once stage
//   StageComm::qo_reduce_after / kv_reduce_after has been computed.
//
// Relays (two-level collectives, opt-in: PlanOptions::relay_node_size). A
// stage's cast may have a second, forwarding phase (StageComm::qo_fwd /
// kv_fwd): a rank that received rows in the first phase (the relay) sends
// some of them on to other ranks, normally of its own node, so that a block
// several ranks of a node need crosses the NIC once. Rules:
//  * a forwarding arg's input_ranges index the relay's receive buffer of the
//    same stage, relative to its start (qo_recv_offset / kv_recv_offset),
//    and lie inside the rows of the first phase (sum of qo/kv
//    output_split_sizes); input_groups repeat those rows' head group. The
//    relay always reads the rows itself (it is one of their receivers), so
//    no buffer holds rows only to pass them on;
//  * the forwarding phase's output splits are appended after the first
//    phase's in the same receive buffer: stage s's receive buffer is the
//    first phase's output splits, then the forwarding phase's, in order, and
//    num_remote_*_tokens counts both. Their order follows the first phase's
//    rule (by source = relay, then the relay's input splits naming this rank);
//  * the forwarding phase runs once the relay has received (and unpacked) its
//    first-phase data of the stage; the stage's compute waits for both phases;
//  * reduce is the transpose, in reverse order: at the reduce point every
//    forwarded output split goes back to its relay first and is merged into
//    the relay's rows (lse-weighted merge for forward O, sum for dQ, dK, dV),
//    then the first phase's reduce sends the relay's (merged) rows back to
//    the source, as without relays.
// Without relays the forwarding args are empty and nothing changes.
#include <cstdint>
#include <string_view>
#include <vector>

#include "cpsched/base/buffer_id.hpp"
#include "cpsched/base/pass.hpp"
#include "cpsched/base/row_kind.hpp"
#include "cpsched/mask/mask.hpp"
#include "cpsched/plan/index_pool.hpp"
#include "cpsched/plan/program.hpp"
#include "cpsched/problem/problem.hpp"

namespace cpsched {

// BufferId (base/buffer_id.hpp): which buffer a range indexes, the rank's own
// shard or its remote buffer of that kind (QO rows for `q`, KV rows for `k`),
// see the file comment.

// One attention call: q rows x k cols with a mask type, in buffer coordinates
// (the type's diagonal is anchored to this rectangle, as in a mask slice).
struct AttnArg {
  Range q;                          // rows of the q buffer (Q in, O/lse out)
  Range k;                          // rows of the k buffer (K, V)
  MaskType type = MaskType::full;
  BufferId q_buf = BufferId::local; // buffer `q` indexes
  BufferId k_buf = BufferId::local; // buffer `k` indexes
  int group = -1;                   // head group computed (-1: all heads, not flattened)
  // Index args (token top-k masks, index_mask.hpp), when index_width > 0:
  // query row r of `q` (0 <= r < q.size()) attends to the k-buffer rows
  // CalcMeta::indices[index_offset + r * index_width + j], j < index_width,
  // skipping -1 (FlashMLA's sparse prefill layout [s_q, topk], in buffer
  // coordinates). `k` is then the hull of those rows and `type` is full.
  std::int32_t index_width = 0;
  std::int64_t index_offset = 0;
  Token index_area = 0;  // pairs it computes (entries other than -1)
  bool is_index() const { return index_width > 0; }
  friend bool operator==(const AttnArg&, const AttnArg&) = default;
};

// A group-cast (forward direction) / group-reduce (transposed) description of
// one stage and one kind (QO or KV) on one rank.
//
// Group-cast: the rank's send data is cut into splits; split i is the local
// range `input_ranges[i]` (heads of group `input_groups[i]`, size
// `input_split_sizes[i]`) and goes to every rank of `dst_indices[i]` (sorted,
// never the rank itself). The stage's receive buffer is cut into
// `output_split_sizes`; output split j comes from rank `src_index[j]` and holds
// heads of group `output_groups[j]`. Output splits are ordered by source rank,
// and the splits from one source are that source's input splits naming this
// rank, in the source's order. Input splits are ordered by (block, group,
// position).
//
// Group-reduce (the transpose): every output split j is sent back to
// `src_index[j]` and reduced into input split i there. Forward O with the
// lse-weighted merge (lse = log sum exp lse_i, O = sum exp(lse_i - lse) O_i,
// together with the host's own partial result); backward dQ, dK, dV by sum.
// Forward QO: cast Q, reduce O+lse. Forward KV: cast K, V. Backward QO: cast
// Q, O, dO, lse; reduce dQ. Backward KV: cast K, V; reduce dK, dV.
struct GroupCollectiveArg {
  std::vector<Token> input_split_sizes;     // tokens of each send split
  std::vector<Range> input_ranges;          // local coords of each input split
  std::vector<int> input_groups;            // head group of each input split (-1: all)
  std::vector<std::vector<Rank>> dst_indices;  // receivers of each input split
  std::vector<Token> output_split_sizes;    // tokens of each receive split
  std::vector<Rank> src_index;              // sender of each receive split
  std::vector<int> output_groups;           // head group of each output split (-1: all)
  friend bool operator==(const GroupCollectiveArg&, const GroupCollectiveArg&) = default;
};

struct CalcMeta {
  std::vector<AttnArg> local_attn_args;                  // stage 0: local buffers only
  std::vector<std::vector<AttnArg>> remote_attn_args;    // [s-1]: args of remote stage s = 1..N
  IndexPool indices;  // the index args' rows (empty for range masks); copies share it (index_pool.hpp)
  // > 0: the index args' rows are the executor's to write (a rank's plan
  // from top-k row runs, problem.hpp), into a pool of this many entries;
  // `indices` is then empty. An arg's rows are what the builder would have
  // written: per query row, its selected keys inside the arg's key block in
  // ascending order as k-buffer rows (CommMeta::remote_kv_rows says where a
  // remote key landed), -1 padded to index_width; `k` is the hull of the
  // cell's keys rather than of the arg's own.
  std::int64_t deferred_index_entries = 0;
  friend bool operator==(const CalcMeta&, const CalcMeta&) = default;
};

// Pairs an arg computes (per head): its slice's area, or an index arg's
// index_area. O(1).
Token arg_area(const AttnArg& arg, const CalcMeta& calc);

// Communication of one remote stage on one rank.
struct StageComm {
  Token num_remote_qo_tokens = 0;  // rows received into the QO buffer (sum of qo.output_split_sizes)
  Token num_remote_kv_tokens = 0;  // rows received into the KV buffer (sum of kv.output_split_sizes)
  Token qo_recv_offset = 0;        // where this stage's QO receive starts in the remote QO buffer
  Token kv_recv_offset = 0;        // where this stage's KV receive starts in the remote KV buffer
  // The last stage (1..N, the same on every rank) whose args read rows
  // received in this stage: its group-reduce may start once that stage is
  // computed. 0 when no rank receives anything of that kind in this stage.
  int qo_reduce_after = 0;
  int kv_reduce_after = 0;
  GroupCollectiveArg qo;
  GroupCollectiveArg kv;
  // Forwarding phase (relays, see the file comment; empty without them):
  // input ranges index this stage's receive buffer from its start, output
  // splits follow qo's / kv's output splits in the receive buffer.
  GroupCollectiveArg qo_fwd;
  GroupCollectiveArg kv_fwd;
  bool has_forwarding() const { return !qo_fwd.input_split_sizes.empty() || !qo_fwd.output_split_sizes.empty() ||
                                       !kv_fwd.input_split_sizes.empty() || !kv_fwd.output_split_sizes.empty(); }
  friend bool operator==(const StageComm&, const StageComm&) = default;
};

// Rows [row, row + tokens.size()) of a rank's remote buffer of one kind hold
// the global tokens `tokens` of head group `group` (-1: all heads).
struct RemoteRun {
  Range tokens;
  Token row = 0;
  int group = -1;
  friend bool operator==(const RemoteRun&, const RemoteRun&) = default;
};

struct CommMeta {
  std::vector<StageComm> stages;  // [s-1]: remote stage s = 1..N
  // Where the rank's remote QO / KV rows come from, sorted by row: filled in
  // plans whose index rows the executor writes (CalcMeta::
  // deferred_index_entries), which maps keys to k-buffer rows with it;
  // empty otherwise (the splits say it only together with the senders').
  std::vector<RemoteRun> remote_qo_rows;
  std::vector<RemoteRun> remote_kv_rows;
  friend bool operator==(const CommMeta&, const CommMeta&) = default;
};

struct PassPlan {
  CalcMeta calc;
  CommMeta comm;
  // The order the rank runs the pass in (plan/program.hpp): the builder
  // writes the default; empty in plans made without one (executors then
  // run the default).
  Program program;
  friend bool operator==(const PassPlan&, const PassPlan&) = default;
};

struct RankPlan {
  PassPlan fwd;
  PassPlan bwd;
  friend bool operator==(const RankPlan&, const RankPlan&) = default;
};

inline const PassPlan& pass_plan(const RankPlan& r, Pass p) { return p == Pass::fwd ? r.fwd : r.bwd; }
inline const GroupCollectiveArg& collective(const StageComm& s, RowKind k) { return k == RowKind::qo ? s.qo : s.kv; }
// The forwarding phase of a kind (relays; empty without them).
inline const GroupCollectiveArg& forwarding(const StageComm& s, RowKind k) {
  return k == RowKind::qo ? s.qo_fwd : s.kv_fwd;
}
// Rows a stage receives in its first phase (where the forwarding phase's rows start).
inline Token first_phase_tokens(const GroupCollectiveArg& a) {
  Token n = 0;
  for (Token x : a.output_split_sizes) n += x;
  return n;
}

struct Plan {
  int num_stages = 1;             // stages after stage 0 (the seed's two-stage model: 1), the local tail included
  // The last stage is a local tail (plan/builder.hpp): it receives nothing
  // and computes local args only, while the reduces of the stages before run.
  bool local_tail = false;
  Sharding sharding;              // token layout the plan indexes (after dispatch, if any)
  Layout layout = Layout::fixed;  // fixed: `sharding` is the caller's; planned: the solver may have chosen it
  std::vector<RankPlan> ranks;    // [rank]
  Rank only_rank = -1;            // >= 0: only this rank's entry was built (the others are empty)
  // True when some stage of some rank has a forwarding phase (relays).
  bool has_forwarding() const {
    for (const RankPlan& r : ranks)
      for (const PassPlan* p : {&r.fwd, &r.bwd})
        for (const StageComm& s : p->comm.stages)
          if (s.has_forwarding()) return true;
    return false;
  }
};

}  // namespace cpsched
