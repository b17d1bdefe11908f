#pragma once
// The timing model (metadata only, no tensors): for every rank and pass, the
// timeline of the plan on a compute stream and a communication stream. It is
// the yardstick solvers are optimised against (step time = fwd + bwd).
//
// Program of one pass on every rank (plan.hpp's execution order, as the
// cuda_nccl runtime issues it):
//   cast(1); compute(0); for s = 1..N: cast(s+1) if s < N; compute(s); reduce(s)
//   then, at the pass end, merge
// where cast(s) group-casts the QO and KV splits of stage s, compute(s) runs
// the stage's args, reduce(t) group-reduces the outputs of every stage whose
// *_reduce_after is t (the last stage when it is outside [s, N]), and merge
// folds the partial outputs received by the reduces into the accumulators.
// A "collective" below is one cast(s) or reduce(t) op (all its stages and
// kinds, issued as one NCCL group of sends and receives).
//
// Rules:
//  * compute(s) waits for this rank's cast(s) (its received data);
//  * reduce(t) waits for compute(t) on this rank (both streams);
//  * pack: before a collective the comm stream packs what the rank sends,
//    reading and writing every byte: kPackFactor (2) x send bytes / HBM;
//    the rank is "ready" when the pack ends;
//  * start: a collective starts on a rank once it and every peer it
//    exchanges data with in that collective are ready (a transfer needs both
//    ends), so a rank waits for a straggling peer's partial outputs;
//  * ports: each rank has, per link class c (inside the node / between nodes,
//    separate hardware), an outgoing and an incoming port. In one collective
//    rank r's outgoing port of class c carries bytes B and messages M (the
//    sum over its transfers of that class); its port time is
//      T_out(r, c) = (M > 0 ? latency_c : 0) + B / bandwidth_c
//    and likewise T_in(r, c). A grouped send/recv overlaps its messages'
//    latencies across peers, so latency is paid once per port per
//    collective, not per message;
//  * transfers: a transfer src -> dst of class c (the bytes of every split
//    of the collective that src sends to dst) starts at
//    max(start(src), start(dst)) and ends at that + max(T_out(src, c),
//    T_in(dst, c)): processor sharing, each port finishes all it carries at
//    its port time, so a sender fanning data out to k peers delays all k,
//    and a receiver fed by k senders delays all k;
//  * a rank's part of the collective ends when its last transfer (in or out)
//    ends; for a cast it then unpacks what it received on the comm stream,
//    kUnpackFactor (2) x received bytes / HBM, and compute(s) waits for that;
//  * merge: the partial outputs a rank receives in reduces are folded into
//    its accumulators (forward O with the lse-weighted merge, backward dQ,
//    dK, dV summed), reading the partials and the accumulator and writing
//    it: kMergeFactor (3) x received bytes / HBM, on the COMPUTE stream of
//    the receiving rank, after its last compute and after every reduce it
//    takes part in has ended (the cuda_nccl runtime waits for all reduces and
//    then launches the merges, so a merge never blocks a later stage's
//    compute in stream order);
//  * overlap on: the two streams run concurrently; off: one stream in
//    program order.
// Relays (plan.hpp): cast(s) is then two collectives, the first phase and,
// once it has ended, the forwarding phase (each with its own pack, ports,
// start rule and unpack; the relay packs from its receive buffer), and
// compute(s) waits for both. reduce(t) is two as well, in reverse order: the
// forwarding phase sends the forwarded partials back to the relays, each
// relay merges what it receives into its rows on its COMPUTE stream once
// they are in (kMergeFactor x received bytes / HBM, a merge op with
// forwarding = true; cuda_nccl issues it there) and only then takes part in
// the first phase's reduce (which waits for the compute stream anyway), which
// sends its merged rows to the source. A pass without forwarding runs exactly
// the collectives above.
// A rank with nothing to move in a collective skips it. Messages are counted
// as cuda_nccl issues them: one per (peer, tensor) with bytes, the tensors
// being forward QO cast: Q; forward QO reduce: O, lse; backward QO cast: Q,
// O, dO, lse; backward QO reduce: dQ; KV cast: K, V; backward KV reduce:
// dK, dV (the forward KV reduce moves nothing). Bytes per token are
// docs/design.md#metrics' (metrics.hpp). Compute time is FLOPs / throughput with FLOPs = 4 x
// area x q heads x dim forward, 2.5 x that backward; with the profile's
// kernel model (kernel_model.hpp) a stage's compute is its args' tiles at
// the kernels' rates plus their fixed costs, one call per (q buffer, k
// buffer, form) of the stage. The compute bound stays the exact area at the
// profile's attention_tflops, so step / bound includes the kernels' losses.
// A profile with hbm_gb_s = 0 (only possible when built in code) charges no
// HBM kernels.
//
// Cost: O(total size of the plan) per pass (args, splits and destination
// lists, P x N stage descriptions), with no per-call allocation once a
// TimingWorkspace has grown to the plan's size.
#include <cstdint>
#include <memory>
#include <vector>

#include "cpsched/plan/plan.hpp"
#include "cpsched/plan/price_sheet.hpp"
#include "cpsched/plan/step_timer.hpp"
#include "cpsched/problem/problem.hpp"
#include "cpsched/hardware/profile.hpp"

namespace cpsched {

// HBM traffic of the data-movement kernels, in multiples of the bytes moved.
inline constexpr double kPackFactor = 2.0;    // pack: read + write each byte sent
inline constexpr double kUnpackFactor = 2.0;  // unpack: read + write each byte received by a cast
inline constexpr double kMergeFactor = 3.0;   // merge / sum: read partial + accumulator, write accumulator

enum class OpKind {
  compute = 0,  // compute stream: a stage's args
  cast = 1,     // comm stream: a group-cast (transfers and unpack)
  reduce = 2,   // comm stream: a group-reduce (transfers)
  pack = 3,     // comm stream: packing the sends of the collective that follows (same stage)
  merge = 4,    // compute stream: merging the partial outputs received by the reduces (pass end;
                // forwarding = true: a relay's merge of forwarded partials at the reduce point)
};

struct TimedOp {
  OpKind kind = OpKind::compute;
  int stage = 0;        // compute / cast / pack: the stage; reduce: the stage it follows; merge: N
  double start = 0;     // seconds from the start of the pass
  double end = 0;
  double bytes = 0;     // cast / reduce: bytes this rank sends plus receives; pack: sent; merge: received
  std::int64_t messages = 0;  // cast / reduce: messages this rank sends plus receives, one per (peer, tensor)
  bool forwarding = false;    // cast / reduce / pack: the forwarding phase of relays
};

struct RankTimeline {
  std::vector<TimedOp> compute;  // in time order
  std::vector<TimedOp> comm;     // in time order
  double end = 0;                // when the rank's last op ends
};

struct PassTimeline {
  Pass pass = Pass::fwd;
  std::vector<RankTimeline> ranks;
  double makespan() const;
};

struct Timeline {
  PassTimeline fwd;
  PassTimeline bwd;
};

// FLOPs of one arg (arg_area: O(1) for a range arg, O(entries) for an index arg).
double arg_flops(const AttnArg& arg, const CalcMeta& calc, const Problem& problem, Pass pass);
// An arg as the kernel model reads it.
KernelArg kernel_arg(const AttnArg& arg, const CalcMeta& calc);

// StepEstimate (plan/step_timer.hpp): a plan's step and its compute bound.

// Scratch buffers of the simulation, reused from call to call: they grow to
// the largest plan seen and are never shrunk. Not shareable between threads
// at the same time; estimate_step without one uses one per thread.
class TimingWorkspace {
 public:
  TimingWorkspace();
  ~TimingWorkspace();
  TimingWorkspace(TimingWorkspace&&) noexcept;
  TimingWorkspace& operator=(TimingWorkspace&&) noexcept;
  struct Buffers;
  Buffers& buffers() { return *b_; }
  // Collective parts (one stage's QO or KV description on one rank) visited
  // by every call so far: the simulation's work, linear in the plan's size
  // (at most 3 visits per part per pass). For tests of that bound.
  std::int64_t parts_visited() const;

 private:
  std::unique_ptr<Buffers> b_;
};

// Compute seconds of a plan's args on one rank in one pass: the kernel
// model's (every stage's args and calls) where the profile has one, else
// FLOPs / attention_tflops.
double compute_seconds(const Problem& problem, const PassPlan& plan, const HardwareProfile& hw, Pass pass);
// The predicted compute of every rank of a plan in each pass (compute_seconds
// of each): what a runtime's benchmark prints beside the attention time it
// measures. A rank's plan (Plan::only_rank) gives 0 for the other ranks.
struct RankCompute {
  double fwd = 0;
  double bwd = 0;
};
std::vector<RankCompute> predicted_compute(const Problem& problem, const Plan& plan, const HardwareProfile& hw);
// All the plan's exact area at attention_tflops / P (fwd + bwd).
double compute_bound(const Problem& problem, const Plan& plan, const HardwareProfile& hw);
// The timing model's step time without keeping per-op records (solvers call
// it to choose between plans); equals simulate_timeline's makespans exactly.
StepEstimate estimate_step(const Problem& problem, const Plan& plan, const HardwareProfile& hw);
StepEstimate estimate_step(const Problem& problem, const Plan& plan, const HardwareProfile& hw, TimingWorkspace& ws);
// The same on a price sheet (plan/price_sheet.hpp): equal to estimate_step on
// the plan PlanBuilder::build would make with the sheet's options, bit for
// bit, at a fraction of the cost (no plan is built). Throws cpsched::Error
// when the sheet's ranks are not the problem's or its arrays do not match.
StepEstimate estimate_step(const Problem& problem, const PriceSheet& sheet, const HardwareProfile& hw);
StepEstimate estimate_step(const Problem& problem, const PriceSheet& sheet, const HardwareProfile& hw,
                           TimingWorkspace& ws);
// The timing model as a plan builder's timer (PlanOptions::timer): estimate_step
// on a sheet, one workspace per thread.
const StepTimer& timing_model_timer();
PassTimeline simulate_pass(const Problem& problem, const Plan& plan, const HardwareProfile& hw, Pass pass,
                           TimingWorkspace& ws);

// Throws cpsched::Error when the plan's shape is broken (rank or stage counts).
PassTimeline simulate_pass(const Problem& problem, const Plan& plan, const HardwareProfile& hw, Pass pass);
Timeline simulate_timeline(const Problem& problem, const Plan& plan, const HardwareProfile& hw);

}  // namespace cpsched
