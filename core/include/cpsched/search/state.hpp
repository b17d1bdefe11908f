#pragma once
// A placement of tasks on ranks with everything the local search asks about
// kept up to date: per-rank loads, how many tasks on a rank need each
// (segment, group), the weighted bytes in total and per rank (send and receive
// kept apart), so that the change of the objective for moving one task is
// computed from the task's few segments, not from the whole placement.
//
// Bytes mode: objective = total + bottleneck_weight x P x bottleneck, where
// total is the weighted bytes summed over ranks and bottleneck = max over
// ranks of max(send, recv) of the same weighted bytes.
//
// Time mode (a TimeObjective is given): every byte is priced in seconds on the
// link class of (host, computing rank), and each rank r gets a predicted time
// (forward + backward, one remote stage):
//     T_r = max(local_r, cast_r) + (compute_r - local_r) + reduce_r
// where compute_r is its compute seconds, local_r those of its local tasks
// (stage 0, which hides the cast), cast_r = max(cast in, cast out) and
// reduce_r = max(reduce in, reduce out) the seconds of its ports (the reduce
// of the last stage is exposed). objective = max_r T_r + spread x mean_r T_r
// (in nanoseconds): the slowest rank makes the step; the mean term steers the
// search off plateaus of the max.
//
// With relays (TimeObjective::relays, as the plan builder makes them), the
// copies of a (segment, group) that k >= 2 ranks of another node than its
// host's need cross the NIC once, to one of them (the relay), which forwards
// them over NVLink to the k - 1 others (and the reduce the other way). So the
// host pays one NIC transfer per such node, each of the k holders one NVLink
// receive, and the relay's NIC receive (less its own NVLink one) and its
// k - 1 forwards go to a pool of the node, shared evenly by its ranks: the
// builder gives each piece to the holder that has received the least over the
// NIC so far, so relayed traffic spreads over the node. A lone holder (k = 1)
// gets a direct NIC transfer, as without relays. Per (segment, group, node)
// the state keeps the holder count and the sum of the holders' ranks (which
// names the other holder when k goes between 1 and 2), so a move still costs
// O(the task's segments), plus the node's ranks whose time a pool changed.
//
// Coupled (TimeObjective::coupled): a one-stage collective ends on a rank only
// when its slowest peer's port is done, compute waits for it, and the reduce
// starts once every peer has computed; so the step is about
//     max(max_r compute_r, max_r cast_r + max_r remote_r) + max_r reduce_r
// (remote_r = compute_r - local_r), which a placement cannot lower by
// loading one rank's ports and another's compute. This is the prediction
// (max_rank_time) and the objective's first term; the four maxima are kept in
// tournament trees over the nodes' maxima (grouped_max.hpp).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "cpsched/search/byte_model.hpp"
#include "cpsched/search/grouped_max.hpp"
#include "cpsched/hardware/node_map.hpp"
#include "cpsched/search/rank_tree.hpp"
#include "cpsched/search/segment_counts.hpp"
#include "cpsched/hardware/task_kernel.hpp"

namespace cpsched::search {

// Prices of time mode (seconds; see the file comment).
struct TimeObjective {
  NodeMap nodes;
  double byte_s[2] = {0, 0};      // seconds per byte: [inside a node, between nodes]
  double load_s = 0;              // compute seconds per unit of load (fwd + bwd)
  // The profile's kernel model (hardware/task_kernel.hpp): a task's compute
  // seconds are then its args' kernel seconds, not load x load_s. Null: none.
  std::shared_ptr<const TaskKernelSeconds> kernel;
  double spread = 0.25;           // weight of the mean rank time
  // Prices relayed collectives across nodes (see the file comment): set where
  // the plan will relay (plan.relay on or auto, ranks on several nodes of
  // `nodes`); a State on a single node ignores it.
  bool relays = false;
  // The step as the ranks wait for each other (see the file comment): the
  // busiest cast port, then the most remote compute, then the busiest reduce
  // port, instead of each rank's own.
  bool coupled = false;
  int link_class(Rank a, Rank b) const { return nodes.link_index(a, b); }
  // Compute seconds (fwd + bwd) of task t of `load`.
  double task_seconds(TaskId t, std::int64_t load) const {
    return kernel ? kernel->both[kernel->unit_of(t)] : static_cast<double>(load) * load_s;
  }
};

// Time mode: a rank's compute seconds (all, and of its local tasks) and the
// seconds of its ports (send and receive), forward + backward, relayed
// traffic included.
struct PortSeconds {
  double compute = 0, local = 0;
  double cast_in = 0, cast_out = 0, reduce_in = 0, reduce_out = 0;
};

class State {
 public:
  // `time` null: bytes mode. The model's prices must then be bytes (time mode
  // multiplies them by seconds per byte of the link class).
  State(const ByteModel& model, const std::vector<Rank>& start, std::int64_t cap, double bottleneck_weight,
        const TimeObjective* time = nullptr);

  const ByteModel& model() const { return *m_; }
  int ranks() const { return P_; }
  Rank rank(TaskId t) const { return rank_[static_cast<std::size_t>(t)]; }
  const std::vector<Rank>& placement() const { return rank_; }
  std::int64_t load(Rank r) const { return load_[static_cast<std::size_t>(r)]; }
  std::int64_t cap() const { return cap_; }
  std::int64_t excess() const;  // sum over ranks of the load above cap
  Rank least_loaded() const { return least_; }  // lowest index on ties
  // For bulk moves that read neither the objective nor the slowest ranks
  // (the unpriced repair): while deferred, moves keep the loads and the least
  // loaded rank but not the slowest-rank list; ending it rebuilds the list
  // once (O(P)), as it would stand after the same moves one by one.
  void defer_top(bool deferred);

  double total() const { return total_; }
  double bottleneck() const;
  double objective() const;
  bool time_mode() const { return time_; }
  // Time mode: the predicted time of rank r (seconds) and the largest one.
  double rank_time(Rank r) const;
  double max_rank_time() const;
  PortSeconds port_seconds(Rank r) const;
  bool relays() const { return relay_; }
  double bottleneck_weight() const { return bottleneck_weight_; }

  // Objective change if task t moved to rank b.
  double delta(TaskId t, Rank b) const;
  void move(TaskId t, Rank b);

  // Moves since the last checkpoint can be undone (iterated local search).
  void checkpoint() { journal_.clear(); }
  void rollback();
  const std::vector<std::pair<TaskId, Rank>>& journal() const { return journal_; }

  // Does rank r compute some task of t's group that needs t's q block (QO) or
  // t's kv block (KV)? The hosts hold their blocks anyway.
  bool holds_q(TaskId t, Rank r) const { return holder(RowKind::qo, t, r); }
  bool holds_kv(TaskId t, Rank r) const { return holder(RowKind::kv, t, r); }
  // Calls f(r) for every rank that holds t's q-block data or kv-block data of
  // t's group (each rank once, ascending), hosts excluded.
  template <class F>
  void for_each_holder(TaskId t, F&& f) const {
    const std::uint64_t* q = words(RowKind::qo, t);
    const std::uint64_t* k = words(RowKind::kv, t);
    for (int w = 0; w < words_; ++w)
      for (std::uint64_t bits = q[w] | k[w]; bits != 0; bits &= bits - 1)
        f(static_cast<Rank>(w * 64 + __builtin_ctzll(bits)));
  }
  // The same for at most `limit` holders, scanning ranks cyclically from
  // `from` (a bounded candidate list at large P; deterministic).
  template <class F>
  void for_each_holder_from(TaskId t, Rank from, int limit, F&& f) const {
    const std::uint64_t* q = words(RowKind::qo, t);
    const std::uint64_t* k = words(RowKind::kv, t);
    const int w0 = from / 64;
    int n = 0;
    for (int i = 0; i <= words_ && n < limit; ++i) {
      const int w = (w0 + i) % words_;
      std::uint64_t bits = q[w] | k[w];
      // The first word is visited twice: its bits at or above `from`, then (at
      // the end of the cycle) those below.
      if (i == 0) bits &= ~std::uint64_t{0} << (from % 64);
      else if (i == words_) bits &= (std::uint64_t{1} << (from % 64)) - 1;
      for (; bits != 0 && n < limit; bits &= bits - 1, ++n) f(static_cast<Rank>(w * 64 + __builtin_ctzll(bits)));
    }
  }
  // Tasks currently on rank r (unordered).
  const std::vector<TaskId>& tasks_on(Rank r) const { return on_[static_cast<std::size_t>(r)]; }

 private:
  struct TaskInfo {
    std::int32_t cell;
    std::int32_t group;
    Rank qhost, khost;
    std::int32_t qblock, kblock;
  };
  std::size_t block_slot(RowKind d, std::int32_t block, int g) const {
    return (static_cast<std::size_t>(block) * 2 + static_cast<std::size_t>(d)) * static_cast<std::size_t>(G_) +
           static_cast<std::size_t>(g);
  }
  const std::uint64_t* words(RowKind d, TaskId t) const;
  bool holder(RowKind d, TaskId t, Rank r) const;
  void add(TaskId t, Rank r, int sign);
  // Full rebuilds (construction, rollback) and the O(log P) update of the
  // ranks a move touched.
  void refresh_top();
  void refresh_least();
  void update_ranks(const Rank* ranks, int n);
  double top_value(Rank r) const;
  double time_delta(TaskId t, Rank a, Rank b) const;
  std::pair<double, double> closed_opened(const TaskInfo& in, RowKind dir, Rank h, Rank a, Rank b) const;
  void touch_move(TaskId t, Rank a, Rank b);
  // Time mode: per-rank seconds, forward + backward.
  struct RankSeconds {
    double compute = 0, local = 0, cast_in = 0, cast_out = 0, red_in = 0, red_out = 0;
    double time() const;
    RankSeconds& operator+=(const RankSeconds& d);
  };
  // Relays: where rank r (on another node than h) starts (sign +1) or stops
  // (-1) needing a (segment, group) of `tokens` tokens while `others` other
  // ranks of its node need it (their ranks summing to `other_sum` mod 2^16),
  // calls acc(rank, recv, send) for each rank's port change and pool(node,
  // recv, send) for its node's pool: tokens x seconds per byte on the
  // receiving and sending side, to be multiplied by the price's bytes per
  // token (out on cast, back on reduce).
  template <class Acc, class Pool>
  void relay_flip(Rank h, Rank r, int sign, int others, std::uint16_t other_sum, double tokens, Acc&& acc,
                  Pool&& pool) const;
  void relay_add(std::int32_t s, int g, Rank h, Rank r, int sign, double tokens, const Price& pr);
  double general_time_delta(TaskId t, Rank a, Rank b) const;
  RankSeconds with_pool(Rank r, const RankSeconds& own, const RankSeconds& pool) const;
  RankSeconds effective(Rank r) const;
  // Coupled: part i of a rank's seconds (0 compute, 1 remote compute, 2 cast
  // port, 3 reduce port) and the prediction from the four maxima.
  static double part(const RankSeconds& x, int i);
  static double coupled_step(const double mx[4]) { return std::max(mx[0], mx[2] + mx[1]) + mx[3]; }
  double coupled_now() const;
  int node_of(Rank r) const { return node_[static_cast<std::size_t>(r)]; }
  int link(Rank a, Rank b) const { return node_of(a) == node_of(b) ? 0 : 1; }  // TimeObjective::link_class
  Rank node_begin(int n) const { return n * to_.nodes.gpus_per_node; }
  Rank node_end(int n) const { return std::min(P_, (n + 1) * to_.nodes.gpus_per_node); }
  void general_touch_move(TaskId t, Rank a, Rank b);

  const ByteModel* m_;
  int P_, G_, words_;
  double bottleneck_weight_;
  std::int64_t cap_;
  std::vector<TaskInfo> info_;
  std::vector<Rank> rank_;
  std::vector<std::int64_t> load_;
  SegmentCounts cnt_;                     // (segment, rank, group): tasks needing it
  std::vector<std::uint32_t> blk_cnt_;    // (block, dir, group, rank): tasks of that block
  std::vector<std::uint64_t> holders_;    // (block, dir, group): rank bitset
  std::vector<double> send_, recv_;
  std::vector<Rank> top_;                 // ranks of the largest max(send, recv), descending
  Rank least_ = 0;                        // least loaded rank
  RankTree<std::int64_t, std::less<>> least_tree_;  // over load_
  RankTree<double, std::greater<>> top_tree_;       // over top_value (when the top list is kept)
  double total_ = 0;
  bool time_ = false;
  bool top_deferred_ = false;
  TimeObjective to_;
  std::vector<RankSeconds> sec_;
  double time_sum_ = 0;                   // sum over ranks of rank_time
  // Relays and the coupled step (time mode, see the file comment); with
  // either, moves and deltas take the general path (general_*).
  bool relay_ = false;
  bool coupled_ = false;
  GroupedMax part_max_[4];                // coupled: part(i) of every rank, grouped by node with relays
  mutable std::vector<std::int32_t> rank_mark_;  // general deltas: 1 + a rank's index in d_ranks_, else 0
  SegmentCounts node_cnt_, node_sum_;     // (segment, node, group): holders there, sum of their ranks mod 2^16
  std::vector<RankSeconds> pool_;         // per node: relayed seconds its ranks share
  std::vector<int> node_;                 // time mode, per rank: its node (to_.nodes)
  std::vector<double> rank_time_;         // time mode, per rank: rank_time, refreshed for the ranks each move touches
  std::vector<int> dirty_nodes_;          // nodes whose pool or relayed holders the current move changed
  std::vector<char> node_dirty_;          // per node: listed in dirty_nodes_
  void clear_dirty();
  // general_time_delta's scratch (one State is used by one thread at a time).
  struct Touched {
    Rank rank;
    RankSeconds d;
  };
  mutable std::vector<Touched> d_ranks_;
  mutable std::vector<std::pair<int, RankSeconds>> d_pools_;
  std::vector<std::vector<TaskId>> on_;
  std::vector<std::int32_t> pos_;         // index of t in on_[rank]
  std::vector<std::pair<TaskId, Rank>> journal_;  // (task, rank it left) since checkpoint
};

}  // namespace cpsched::search
