#pragma once
// The timing model (metadata only, no tensors): for every rank and pass, the
// timeline of the plan on a compute stream and a communication stream.
//
// Program of one pass on every rank (plan.hpp's execution order):
//   cast(1); compute(0); for s = 1..N: cast(s+1) if s < N; compute(s); reduce(s)
// where cast(s) group-casts the QO and KV splits of stage s, compute(s) runs
// the stage's args, and reduce(t) group-reduces the outputs of every stage
// whose *_reduce_after is t. Rules:
//  * compute(s) waits for this rank's cast(s) (its received data);
//  * reduce(t) waits for compute(t) on this rank;
//  * a collective starts on a rank once it and every peer it exchanges with
//    in that collective are ready (a transfer needs both ends), so a rank
//    waits for a straggling peer's partial outputs;
//  * a rank's messages serialize on its link: per direction and link class
//    (inside the node / between nodes, which are separate hardware), time =
//    messages x latency + bytes / bandwidth; the collective lasts the longest
//    of the four. A message is one (peer, QO or KV) pair: the splits to one
//    peer travel packed together, as all-to-all-v does;
//  * overlap on: the two streams run concurrently; off: one stream in
//    program order.
// A rank with nothing to move in a collective skips it. Compute time is
// FLOPs / throughput with FLOPs = 4 x area x q heads x dim forward, 2.5 x that
// backward. Bytes per token are DESIGN §5's (metrics.hpp).
#include <vector>

#include "cpsched/plan.hpp"
#include "cpsched/problem.hpp"
#include "cpsched/hardware.hpp"

namespace cpsched {

enum class OpKind { compute = 0, cast = 1, reduce = 2 };

struct TimedOp {
  OpKind kind = OpKind::compute;
  int stage = 0;        // compute / cast: the stage; reduce: the stage it follows
  double start = 0;     // seconds from the start of the pass
  double end = 0;
  double bytes = 0;     // comm: bytes this rank sends plus receives
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

// FLOPs of one arg (area from the closed form: O(1) per arg).
double arg_flops(const AttnArg& arg, const Problem& problem, Pass pass);

// The step time of a plan and its yardstick, the compute bound: the sum over
// ranks of their compute time (fwd + bwd) / P, i.e. perfect balance with free
// communication. Seconds.
struct StepEstimate {
  double fwd = 0;
  double bwd = 0;
  double compute_bound = 0;
  double step() const { return fwd + bwd; }
  double ratio() const { return compute_bound > 0 ? step() / compute_bound : 1.0; }
};

// Compute seconds of a plan's args on one rank in one pass (FLOPs / throughput).
double compute_seconds(const Problem& problem, const PassPlan& plan, const HardwareProfile& hw, Pass pass);
double compute_bound(const Problem& problem, const Plan& plan, const HardwareProfile& hw);
// The timing model's step time without keeping per-op records (solvers call
// it to choose between plans); equals simulate_timeline's makespans.
StepEstimate estimate_step(const Problem& problem, const Plan& plan, const HardwareProfile& hw);

// Throws cpsched::Error when the plan's shape is broken (rank or stage counts).
PassTimeline simulate_pass(const Problem& problem, const Plan& plan, const HardwareProfile& hw, Pass pass);
Timeline simulate_timeline(const Problem& problem, const Plan& plan, const HardwareProfile& hw);

}  // namespace cpsched
