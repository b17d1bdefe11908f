#pragma once
// PlanBuilder (docs/architecture.md#data-flow, docs/plan_format.md): turns an assignment into the per-rank CalcMeta
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
// with its own group-cast. Two cuts; without a hardware profile
// (PlanOptions::hardware) the first, the receivers' cut. Rule A, per
// receiving rank and pass:
//  1. its incoming transfers are ordered by bytes to move before compute (the
//     pass's "out" bytes of docs/design.md#metrics) per unit of load of the tasks that
//     need them, cheapest first, ties by (bytes, source rank, kind QO before
//     KV, block, group);
//  2. its remote tasks are walked in the order of their later transfer in
//     that list, and each transfer is sent with the first task that needs it
//     (a task's two transfers travel together);
//  3. in that sending order the transfers are cut by bytes into stages that
//     double: a transfer goes to the first stage s with bytes_before_it <
//     total_bytes x (2^s - 1) / (2^N - 1);
//  4. each remote task runs in the first stage where all its data has
//     arrived: the largest stage of its (one or two) transfers.
// So stage 1 is small (only stage 0's local work hides its cast) and carries
// the transfers that unlock the most work per byte, each later stage arrives
// while the previous one computes, and the tasks of stage s never wait for
// data of a later stage. With N = 1 this is
// the seed's two-stage model (stage 0 local, stage 1 remote). Forward and
// backward use the same rows; their stage cuts may differ because the bytes
// per token differ (backward moves Q, O, dO and lse out).
//
// Rule A cuts each receiver's bytes alone, so when a few ranks send far more
// than the rest (the hosts of a long document in the fixed layout) every
// receiver takes their rows in its first stage and their ports hold up
// stage 1 everywhere. Rule B, the ports' cut, keeps steps 1, 2 and 4 and
// replaces step 3: every rank has an outgoing and an incoming port per link
// class (inside a node, between nodes: the profile's GPUs per node), a
// transfer loads its sender's outgoing and its receiver's incoming port by
// its bytes times the class's time per byte (inside a node: the ratio of the
// bandwidths), and stage s may fill each port up to 1.1 x the busiest port's
// load over the pass x 1.5^(s-1) / sum of 1.5^(k-1), k = 1..N. Transfers
// are visited by the share of their receiver's bytes sent before them (then
// receiver, then send order) and each goes to the first stage where both its
// ports have room, else to stage N. Light ports so send nearly all early,
// the busiest spread theirs over every stage. With a hardware profile and
// N >= 2 the builder makes both cuts' price sheets, times them with
// PlanOptions::timer (the timing model's) on that profile and keeps rule B
// only when it is faster: the choice is the same on every rank. (Under a kernel
// model, on the profile without its table: exact areas, today's cut at
// today's cost; the kernel model prices the plan.)
//
// The local tail. Every reduce waits for the compute of its stage, so the
// reduces of the last stages run after all compute and nothing hides them.
// With a hardware profile and N >= 2 the plan gets one more stage, N + 1
// (Plan::local_tail, counted in num_stages), which receives nothing: each
// rank's local tasks from half its local load on (in task order) run there
// instead of in stage 0, while the reduces of stages 1..N run. Stage 0
// keeps the first half to hide stage 1's cast.
//
// Attention args: each mask slice of a cell is clipped to the cell exactly
// (cpsched/slice_clip.hpp: up to three slices of the four types) and moved to
// buffer coordinates; a piece whose rows or cols are not contiguous in the
// buffer is cut further.
#include <memory>
#include <optional>

#include "cpsched/base/buffer_recycler.hpp"
#include "cpsched/problem/assignment.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/plan/plan.hpp"
#include "cpsched/plan/price_sheet.hpp"
#include "cpsched/plan/shape.hpp"
#include "cpsched/plan/step_timer.hpp"

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
  // false: index args (token top-k masks) get their shape and area but not
  // their rows (CalcMeta::indices stays empty): what the timing model needs to
  // price a plan, at a fraction of the cost on large selections. Such a plan
  // cannot be executed or validated. Range masks are unaffected.
  bool index_rows = true;
  // >= 0: build only this rank's CalcMeta and CommMeta (the other ranks'
  // stay empty; Plan::only_rank says so), each equal to the full plan's. With
  // one stage and no relays only the transfers of the blocks the rank sends
  // and its own are kept (every rank's tokens are still counted, for the
  // metrics), and the comm layout and the args cost the rank's own part only;
  // else the stage cut and emission order are the full plan's, so the
  // transfers of every rank are collected (with relays every split counts:
  // the NIC load so far picks the relays). -1: every rank.
  Rank rank = -1;
  // With rank >= 0: every rank's CommMeta too, from every rank's transfers
  // (the other ranks' CalcMeta stays empty): the peers that rank's plan is
  // validated against (validate_rank_plan), where the problem may hold only
  // that rank's index rows. The rank's own entry is the same.
  bool peers_comm = false;
  // Where the index pools' buffers come from: a Session's recycler
  // (base/buffer_recycler.hpp), so that a rank's pool of tens of MiB reuses
  // the memory of an earlier plan's; null: new buffers. The plan is the same.
  BufferRecycler* buffers = nullptr;
  // The cluster the plan is for: with N >= 2 stages the builder keeps the
  // faster of the two stage cuts on it and ends the plan with a local tail
  // (above). Null: rule A, no tail. Every rank must build with the same
  // profile to get its part of the same plan.
  const HardwareProfile* hardware = nullptr;
  // Which cut: automatic (the faster on `hardware`, rule A without one), or
  // one of the two (ports needs `hardware`): the plan shape's (PlanShape::cut),
  // where a solver chose it.
  using StageCut = PlanShape::Cut;
  StageCut stage_cut = StageCut::automatic;
  // What times a plan on `hardware` where the builder chooses (the automatic
  // cut, two or more stages, something sent) or prices (PlanBuilder::price):
  // the timing model's, timing_model_timer() (timing/model.hpp), handed in
  // by the caller since plans do not include the model that times them.
  // Null: such a build throws cpsched::Error; a cut named needs none. A
  // PlanBuilder keeps the cut it chose per shape and profile: give one
  // builder one timer.
  const StepTimer* timer = nullptr;
};

// Throws cpsched::Error when the assignment is invalid, stages < 1,
// relay_node_size < 0, or the automatic cut must be chosen on `hardware`
// without a timer. Builds without NDEBUG run validate_plan
// (plan_validator.hpp) on the result and throw its problems.
Plan build_plan(const Assignment& a, const PlanOptions& options);

// Plans of one assignment under several options (stage counts, relays): the
// transfers and each pass's send order (steps 1-2 of the stage rule) are
// computed once, by the first build that needs them, and reused; every plan
// equals build_plan's. Solvers that price a candidate at several stage counts
// use it. Not for concurrent use by several threads.
class PlanBuilder {
 public:
  explicit PlanBuilder(Assignment a);  // validates the assignment (throws cpsched::Error)
  // Collecting the transfers on `threads` threads (0: one per million tasks,
  // up to the hardware's); the plans are the same at any count.
  PlanBuilder(Assignment a, int threads);
  ~PlanBuilder();
  PlanBuilder(PlanBuilder&&) noexcept;
  PlanBuilder& operator=(PlanBuilder&&) noexcept;
  const Assignment& assignment() const;
  // What its plans move (metrics.hpp's Transfer, one per block, head group
  // and computing rank; grouped by computing rank), from the transfers kept.
  std::vector<Transfer> transfers() const;
  // compute_metrics(assignment(), transfers()), from the tokens counted while
  // the transfers were collected (a rank's plan alone keeps only its own
  // transfers but counts every rank's tokens).
  Metrics metrics() const;
  Plan build(const PlanOptions& options) const;
  // What the timing model reads of build(options)'s plan, without building
  // it (price_sheet.hpp): every rank's area per stage and tokens per peer and
  // collective, the same relays and stage cut. The timing model gives it the
  // plan's step to the last bit. options.rank must be -1; index_rows and
  // buffers are not read; the automatic cut needs the timer, as build().
  // How the host prices a placement (pricing/host_pricing.hpp).
  PriceSheet price_sheet(const PlanOptions& options) const;
  // options.timer's step of that sheet on options.hardware (both required),
  // reusing the timing the automatic cut's choice already did; `forwards` (may be null):
  // whether the plan relays anything.
  StepEstimate price(const PlanOptions& options, bool* forwards = nullptr) const;
  // price(options), and the same shape's plan priced on `areas` too (the
  // profile without its kernel model; the stage cut, where automatic, is
  // chosen on exact areas for both, as build() chooses it under a kernel
  // model): one more run of the timing model. What a planner that knew no
  // kernel model priced, beside what the kernels cost. `forwards*` (each may
  // be null): whether each plan relays.
  StepEstimate price(const PlanOptions& options, const HardwareProfile& areas, StepEstimate& on_areas,
                     bool* forwards = nullptr, bool* forwards_on_areas = nullptr) const;
  // The stage cut a plan built with `options` takes: the one asked, or the
  // one build() chose (automatic, two or more stages on a profile); automatic
  // where it has none to take (one stage, no profile, nothing sent) or none
  // was chosen yet. What a rank building its own plan with that cut named
  // is spared (PlanShape::cut).
  PlanShape::Cut cut_of(const PlanOptions& options) const;

 private:
  // The stage of every xfer of each pass: rule A, or B on `by_ports`.
  struct Cut;
  Cut cut(int stages, const HardwareProfile* by_ports) const;
  // The cut a plan under `options` takes (automatic: both priced on the
  // profile, once per shape); `kept` and `kept_step` (each may be null)
  // receive the chosen cut's sheet and its timing where both were priced.
  Cut chosen_cut(const PlanOptions& options, std::optional<PriceSheet>* kept,
                 std::optional<StepEstimate>* kept_step) const;
  // price_sheet; `timed` (may be null) receives its timing where choosing
  // the cut made one.
  PriceSheet price_sheet(const PlanOptions& options, std::optional<StepEstimate>* timed) const;
  Plan assemble(const PlanOptions& options, const Cut& cut) const;
  PriceSheet sheet(const PlanOptions& options, const Cut& cut) const;
  struct State;
  std::unique_ptr<State> s_;
};
// Token-granular transfers of an assignment (the builder's): for every
// (block, group, computing rank != host) the union of the needed rows (QO)
// or cols (KV) of the tasks placed there. Sorted by (kind, block, group, dst).
std::vector<Transfer> transfers(const Assignment& a);
// compute_metrics on those transfers.
Metrics compute_metrics(const Assignment& a);

inline Plan build_plan(const Assignment& a, int stages = 1) { return build_plan(a, PlanOptions{stages, 0}); }

}  // namespace cpsched
