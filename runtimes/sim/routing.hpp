#pragma once
// Matching the two sides of a group collective: which input split of which
// sender lands in which output split of which receiver. Per plan.hpp, the
// output splits a receiver takes from one source are, in order, that source's
// input splits naming the receiver, in the source's order. Anything that does
// not pair up (counts, sizes, groups, ranks) is a fault: the executor reports
// it and moves nothing for it, so the result breaks instead of being patched.
#include <string>
#include <vector>

#include "cpsched/plan/plan.hpp"
#include "plan_access.hpp"

namespace cpsched::sim {

struct Route {
  Rank src = 0;
  int in = 0;     // input split of src
  Rank dst = 0;
  int out = 0;    // output split of dst
};

// Fault messages, capped so that a badly broken plan gives a readable report.
class Faults {
 public:
  void add(std::string msg);
  bool empty() const { return total_ == 0; }
  std::size_t total() const { return total_; }
  const std::vector<std::string>& shown() const { return shown_; }
 private:
  static constexpr std::size_t kShown = 20;
  std::vector<std::string> shown_;
  std::size_t total_ = 0;
};

// Offsets of each output split inside the stage's receive buffer (prefix sums).
std::vector<Token> output_offsets(const GroupCollectiveArg& a);

// Routes of one stage (1-based) and kind, sorted by (src, in, dst). Also checks
// each rank's arg for internal consistency (array lengths, split sizes vs
// ranges, ranges inside the local buffer of `local_rows[r]` rows, groups,
// ranks, the declared receive token count, which counts both phases).
// forwarding: the stage's forwarding phase (relays, plan.hpp) instead, whose
// input ranges must lie inside the rank's first-phase rows of the stage
// (`local_rows` is not used then).
std::vector<Route> match_routes(const Plan& plan, Pass pass, int stage, RowKind kind, const HeadLayout& heads,
                                const std::vector<Token>& local_rows, Faults& faults, bool forwarding = false);

}  // namespace cpsched::sim
