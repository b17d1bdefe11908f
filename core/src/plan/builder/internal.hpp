#pragma once
// Internal steps of build_plan, one file each:
//   transfers.cpp       which rows travel (transfers) and in which stage
//   comm.cpp            the group-collective args of every rank and stage
//   calc.cpp            the attention args of every rank and stage
#include <cstdint>
#include <vector>

#include "cpsched/base/buffer_recycler.hpp"
#include "cpsched/problem/assignment.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/plan/plan.hpp"
#include "cpsched/plan/price_sheet.hpp"
#include "cpsched/hardware/task_kernel.hpp"

namespace cpsched::plan_detail {

// The rows (QO) or cols (KV) of one block and head group that one computing
// rank needs from the block's host: the union over the tasks placed there.
struct Xfer {
  RowKind kind = RowKind::qo;
  std::int32_t block = 0;
  std::int32_t group = 0;  // 0..G-1 (0 when head groups are not flattened)
  Rank host = 0;
  Rank dst = 0;
  RangeSet rows;           // global tokens
  Token tokens = 0;        // rows.size()
};

// Threads for `work` units, at least `per_thread` each, up to the hardware's.
int threads_for(std::size_t work, std::size_t per_thread);

struct Transfers {
  // >= 0: what this rank's one-stage plan without relays reads (RankKeys):
  // the xfers of the blocks it hosts, its own, and after them (past
  // dst_begin's end, dst -1) one stand-in for the other receivers of each of
  // its own: task_q and task_k are -1 where the xfer is not kept.
  Rank only = -1;
  std::vector<Xfer> xfers;               // grouped by dst (ascending)
  std::vector<std::size_t> dst_begin;    // xfers of rank d: [dst_begin[d], dst_begin[d+1])
  std::vector<std::int32_t> task_q;      // per task: its QO xfer, -1 when q is local
  std::vector<std::int32_t> task_k;      // per task: its KV xfer, -1 when kv is local
  std::vector<std::int32_t> task_order;  // tasks grouped by computing rank, task order inside
  std::vector<std::size_t> rank_begin;   // tasks of rank d: task_order[rank_begin[d] .. rank_begin[d+1])
  TransferTokens tokens;                 // of every xfer, kept or not (the metrics)
  bool remote_q = false, remote_k = false;  // some task of any rank reads a remote QO / KV block
};

// The task at position i of Transfers::task_order, as the builder's steps
// read it.
struct PlacedTask {
  TaskId t = 0;
  const Cell* cell = nullptr;
  int group = -1;          // its head group, -1 when head groups are not flattened
  std::int32_t xq = -1;    // its QO xfer, -1 when q is local
  std::int32_t xk = -1;    // its KV xfer, -1 when kv is local
};
inline PlacedTask placed_task(const TaskGrid& g, const Transfers& tr, std::size_t i) {
  const auto t = static_cast<TaskId>(tr.task_order[i]);
  const auto ut = static_cast<std::size_t>(t);
  return {t, &g.cell_of(t), g.flattened() ? static_cast<int>(ut % static_cast<std::size_t>(g.num_groups())) : -1,
          tr.task_q[ut], tr.task_k[ut]};
}

// threads: 0 for one per million tasks, up to the hardware's; the result is
// the same at any count. only >= 0: the xfers that rank's one-stage plan
// without relays reads (Transfers::only), each the same as in the full set.
Transfers collect_transfers(const Assignment& a, int threads = 0, Rank only = -1);

// Which xfers rank `only`'s one-stage plan without relays reads (by key:
// kind, block, group). It sends the blocks it hosts to every receiver, so
// all their xfers are kept. Of a block it receives it keeps its own xfer;
// the other receivers' rows matter only where they begin or end inside its
// rows (layout_comm cuts a block's rows where the set of receivers changes),
// so they are replaced by one stand-in (add_stand_ins) that begins or ends
// at each of those points.  (rank_transfers.cpp)
class RankKeys {
 public:
  enum Use { count, all, ends };  // only count its tokens; keep it; count it and note its range ends
  RankKeys(const TaskGrid& g, const Transfers& tr, Rank only);  // tr: its task_order and rank_begin
  Rank only() const { return only_; }
  Use use(std::size_t key, Rank dst) const {
    const Of o = of_[key];
    return o == Of::sent ? all : o == Of::received ? (dst == only_ ? all : ends) : count;
  }

 private:
  enum class Of : std::uint8_t { other, sent, received };
  Rank only_;
  std::vector<Of> of_;
};
// Appends a stand-in (dst -1) for every xfer of `only` whose rows the other
// receivers' range ends (ends[part][key], any order, repeats allowed) cut.
void add_stand_ins(const TaskGrid& g, const RankKeys& keys, const std::vector<const std::vector<std::vector<Token>>*>& ends,
                   Transfers& tr);

// The order in which each receiver's xfers are sent for a pass whose out
// bytes per token are (qo_out, kv_out): steps 1-2 of the stage rule in
// plan_builder.hpp, which do not depend on the stage count. seq holds every
// xfer once, grouped by dst as Transfers::xfers ([dst_begin[d], dst_begin[d+1])).
struct SendOrder {
  Bytes qo_out = 0, kv_out = 0;
  std::vector<std::int32_t> seq;
};
SendOrder send_order(const Assignment& a, const Transfers& tr, Bytes qo_out, Bytes kv_out);

// Stage (1..N) of each xfer: step 3 of the rule, the send order cut by bytes.
std::vector<int> assign_stages(const Transfers& tr, const SendOrder& order, int stages);

// The cluster's ports as the ports' stage cut weighs them: ranks r and t
// share a node when r / node_size == t / node_size (node_size 0: all ranks
// do), and a byte inside a node takes intra_cost of the time a byte between
// nodes takes (the bandwidths' ratio).
struct PortCosts {
  int node_size = 0;
  double intra_cost = 1.0;
};

// Stage (1..N) of each xfer by the ports' cut (plan/builder.hpp): the same
// send order, cut so that no rank's port carries more than its stage's
// share of the busiest port's bytes.
std::vector<int> assign_stages_by_ports(const Transfers& tr, const SendOrder& order, int stages, const PortCosts& ports);

// Where an xfer's rows land in its dst's remote buffer: maximal runs of
// global tokens [global) at remote rows [off, off + global.size()), sorted by
// token. Without relays an xfer's rows are one contiguous stretch of the
// receive buffer; a relayed piece lands after the stage's first phase.
struct XferRun {
  Range global;
  Token off = 0;
};
struct XferLayout {
  std::vector<std::size_t> begin;  // runs of xfer i: runs[begin[i] .. begin[i + 1])
  std::vector<XferRun> runs;
};

// Relays (plan_builder.hpp): node size (< 2: none) and the pass's bytes per
// token of each kind, which weigh the NIC load that picks a relay.
struct RelayOptions {
  int node_size = 0;
  Bytes qo_bytes = 1;
  Bytes kv_bytes = 1;
};

// The splits of a price sheet's pass (price_sheet.hpp): one per (phase,
// kind, stage, sender, receiver), its tokens summed over what is added to it,
// kept per part in the order each was first added (the order in which the
// plan's GroupCollectiveArgs would list them). No allocation per split.
class SheetSink {
 public:
  // keep_layout: layout_comm also returns where the rows land (a kernel
  // model's sheet cuts args there).
  SheetSink(int ranks, int stages, bool keep_layout = false);
  bool keeps_layout() const { return keep_layout_; }
  void add(int phase, RowKind kind, int stage, Rank src, Rank dst, Token tokens);
  // Writes the parts' splits and has_forwarding into `out`.
  void finish(PriceSheet::Pass& out) const;

 private:
  struct Entry {
    std::uint64_t key;  // (((phase * 2 + kind) * stages + stage - 1) * P + src) * P + dst
    Token tokens;
  };
  std::size_t slot_of(std::uint64_t key) const;
  void grow();
  int P_, N_;
  bool keep_layout_;
  std::vector<Entry> entries_;        // in first-added order
  std::vector<std::int32_t> table_;   // open addressing: entry index + 1, 0 empty
};

// Fills comm of every rank (plan.ranks[r].<pass>.comm via `pass`) and returns
// where every xfer's rows land on its dst. summary (pricing): the same relays
// and the same tokens per (phase, peer, kind, stage) go to the sink, one
// split each; `pass` is not read (pass an empty list) and, where the sink
// keeps the layout, the layout's offsets are relative to each stage's receive
// buffer (where args are cut); else none is returned.
// only >= 0: that rank's comm alone (the others' stages are left untouched);
// the returned layout then holds the runs of the xfers it receives.
XferLayout layout_comm(const Assignment& a, const Transfers& tr, const std::vector<int>& stage, int stages,
                       const RelayOptions& relay, std::vector<PassPlan*>& pass, SheetSink* summary = nullptr,
                       Rank only = -1);
// A price sheet's splits without relays: every xfer's tokens to the split of
// (kind, stage, host, dst), so every rank sends and receives the same tokens
// per peer, kind and stage as with layout_comm, and the timing model counts
// the same messages (one per peer and tensor).
void summary_comm(const Transfers& tr, const std::vector<int>& stage, SheetSink& sink);
// The attention area of every rank and stage and the reduce_after fields of
// a price sheet's pass, as build_calc would make them; with `hw`'s kernel
// model also each stage's kernel seconds in `pass` (PriceSheet::Pass::kernel),
// its args cut where `where` (relays: layout_comm's summary) says a buffer is
// discontinuous, as build_calc cuts them (null: transfers land contiguous).
// `kernel`: the grid's task_kernel_seconds on `hw` (non-null with a kernel model).
void sheet_calc(const Assignment& a, const Transfers& tr, const std::vector<int>& stage, int stages, bool local_tail,
                const HardwareProfile* hw, const TaskKernelSeconds* kernel, Pass pass, const XferLayout* where,
                PriceSheet::Pass& out);
// Fills calc of every rank (only >= 0: of that rank) and the reduce_after
// fields of comm (the same on every rank, so computed over all tasks).
// Index pools are written into buffers from `buffers` (null: new ones).
// local_tail: `stages` counts the tail, which no xfer reaches, and each
// rank's local tasks past the first half of its local load run there.
void build_calc(const Assignment& a, const Transfers& tr, const std::vector<int>& stage, const XferLayout& where,
                int stages, std::vector<PassPlan*>& pass, bool index_rows = true, Rank only = -1,
                BufferRecycler* buffers = nullptr, bool local_tail = false);

// Index args (token top-k masks) of rank d's tasks: args[i] are those of
// task tr.task_order[tr.rank_begin[d] + i]; with `write_pool` also the
// rank's pool (its buffer from `buffers`, null: a new one), else shapes and
// areas only (PlanOptions::index_rows = false). The pool is counted, then
// written in place, each task's part by one of up to the hardware's threads
// (a DSA rank's pool is tens of MiB); the result does not depend on them.
// (plan/index/args.cpp)
struct RankIndexArgs {
  std::vector<std::vector<AttnArg>> args;
  IndexPool pool;
  std::int64_t deferred_entries = 0;  // rank_deferred_index_args: the pool the executor writes
};
RankIndexArgs rank_index_args(const Assignment& a, const Transfers& tr, const XferLayout& where, std::size_t d,
                              bool write_pool, BufferRecycler* buffers);
// The same shapes from the problem's row runs (Problem::index_row_runs),
// without the rows: no pool, its size in deferred_entries (the executor
// writes it, CalcMeta::deferred_index_entries). (plan/index/deferred_index_args.cpp)
RankIndexArgs rank_deferred_index_args(const Assignment& a, const Transfers& tr, const XferLayout& where,
                                       std::size_t d);

// Offset of each block inside its host's local buffer.
std::vector<Token> block_local_offsets(const Sharding& sh);

}  // namespace cpsched::plan_detail
