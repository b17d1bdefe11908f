#pragma once
// Figures of a pass timeline. Per rank, over [0, T] with T the pass time
// (the slowest rank's end):
//   compute  time the compute stream runs (attention and the merges)
//   comm     time the communication stream works (packs, collectives with
//            their unpacks; not the wait for peers before a collective)
//   hidden   comm time during which the rank also computes
//   exposed  comm - hidden: communication nothing hides
//   idle     T - (compute + exposed): the rank waits (for data, for peers,
//            or for the slowest rank to finish)
// overlap ratio = sum hidden / sum comm over ranks (1 when nothing moves).
#include <vector>

#include "cpsched/timing/model.hpp"

namespace cpsched {

struct RankStats {
  double end = 0, compute = 0, comm = 0, hidden = 0, exposed = 0, idle = 0;
};

struct PassStats {
  double time = 0;          // seconds: max over ranks of their end
  int critical_rank = 0;    // the rank that ends last (lowest index on ties)
  double compute_max = 0, compute_mean = 0;
  double comm_max = 0, comm_mean = 0;
  double exposed_max = 0, exposed_mean = 0;
  double idle_max = 0, idle_mean = 0;
  double overlap_ratio = 1;
  std::vector<RankStats> ranks;
};

PassStats pass_stats(const PassTimeline& t);

// Length of the intersection of two lists of disjoint, time-ordered intervals.
double overlap_length(const std::vector<TimedOp>& a, const std::vector<TimedOp>& b);

}  // namespace cpsched
