#include "cpsched/timing/stats.hpp"

#include <algorithm>

namespace cpsched {

double overlap_length(const std::vector<TimedOp>& a, const std::vector<TimedOp>& b) {
  double sum = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const double lo = std::max(a[i].start, b[j].start), hi = std::min(a[i].end, b[j].end);
    if (hi > lo) sum += hi - lo;
    if (a[i].end < b[j].end) ++i;
    else ++j;
  }
  return sum;
}

PassStats pass_stats(const PassTimeline& t) {
  PassStats s;
  const std::size_t P = t.ranks.size();
  s.ranks.resize(P);
  s.time = t.makespan();
  double comm_sum = 0, hidden_sum = 0;
  for (std::size_t r = 0; r < P; ++r) {
    const RankTimeline& rt = t.ranks[r];
    RankStats& x = s.ranks[r];
    x.end = rt.end;
    for (const TimedOp& o : rt.compute) x.compute += o.end - o.start;
    for (const TimedOp& o : rt.comm) x.comm += o.end - o.start;
    x.hidden = overlap_length(rt.compute, rt.comm);
    x.exposed = x.comm - x.hidden;
    x.idle = std::max(0.0, s.time - x.compute - x.exposed);
    comm_sum += x.comm;
    hidden_sum += x.hidden;
    if (rt.end > t.ranks[static_cast<std::size_t>(s.critical_rank)].end) s.critical_rank = static_cast<int>(r);
    s.compute_max = std::max(s.compute_max, x.compute);
    s.comm_max = std::max(s.comm_max, x.comm);
    s.exposed_max = std::max(s.exposed_max, x.exposed);
    s.idle_max = std::max(s.idle_max, x.idle);
    s.compute_mean += x.compute;
    s.comm_mean += x.comm;
    s.exposed_mean += x.exposed;
    s.idle_mean += x.idle;
  }
  if (P > 0) {
    const double n = static_cast<double>(P);
    s.compute_mean /= n;
    s.comm_mean /= n;
    s.exposed_mean /= n;
    s.idle_mean /= n;
  }
  s.overlap_ratio = comm_sum > 0 ? hidden_sum / comm_sum : 1.0;
  return s;
}

}  // namespace cpsched
