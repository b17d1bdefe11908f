#pragma once
// How much the time mode spends on a plan, planned before it spends it.
//
// What a user pays per attention call is (the planning time on the critical
// path) x planning_weight + the step, with planning_weight = 1 / uses (0 when
// the plan is made ahead: plan/uses.hpp). So each phase of the solve is run
// only when it is expected to shorten the step by more than its own weighted
// time. Both sides are predicted from counts, never from a clock (the same
// input gives the same plan on any machine and at any load):
//  * the cost of a phase: a linear model in the grid's tasks T and ranks P
//    whose coefficients were measured on the 2-core benchmark machine
//    (docs/bounds.md#uses-and-effort);
//  * its gain: a fixed fraction of the gap between the best step found so far
//    and the compute bound (the phase's measured share of that gap on the
//    benchmark workload, same section).
// A phase runs iff weight x cost < gain. Made ahead (weight 0) every phase
// runs: the full search, exactly as without a uses count.
#include <cstdint>

namespace cpsched::search {

struct PhaseCosts {
  // Seconds of one phase on a grid of `tasks` tasks over `ranks` ranks.
  double price_plan = 0;     // the timing model on one placement at one shape (its price sheet)
  double member = 0;         // the binary_greedy member's solve
  double dispatch = 0;       // a member that dispatches (static): its grid, solve and plan
  double short_search = 0;   // repair, descent and a short iterated search from one start
  double full = 0;           // the full time-mode solve (members, searches, pricing)
  double stages = 0;         // the chosen placement priced at two stages, and every rank's transfers for its plan
  double stages_unpriced = 0;  // every rank's transfers for its two-stage plan, not priced
  double polish = 0;         // kPolishMoves of search from the best candidate, and its plan priced
};

// Move evaluations of the polish: the search from the best candidate on one
// node (quick_time.cpp).
inline constexpr std::int64_t kPolishMoves = 1000;

// planned: the layout is the solver's (problem.layout), so the full solve
// also runs and searches the members that dispatch.
PhaseCosts predict_phase_costs(std::int64_t tasks, int ranks, bool planned);

// The expected share of (best step - compute bound) that each phase recovers,
// each measured on the benchmark workload: the numbers behind every one are in
// docs/bounds.md#the-default-solvers-phase-constants, by name.
struct PhaseGains {
  static constexpr double price = 0.25;  // pricing the best predicted starts (the model misranks some)
  // A member solver beside the starts, when the ranks fit in one node and
  // when they span several: binary_greedy prices every byte alike (the
  // seed's), so across nodes its placements send over the NIC what usp and
  // hybrid keep inside a node, and it rarely wins there.
  static constexpr double member_one_node = 0.3;
  static constexpr double member_nodes = 0.03;
  // static's dispatch (planned layout) keeps documents on their ranks: the
  // largest gain on one to four nodes; on eight its members' predictions and
  // plans on the finer grid cost most of what they recover. (dispatch_nodes
  // also where the full search may follow on more than two nodes.)
  static constexpr double dispatch_one_node = 0.5;
  static constexpr double dispatch_few_nodes = 0.45;
  static constexpr double dispatch_nodes = 0.05;
  static double dispatch(int nodes) {
    return nodes <= 1 ? dispatch_one_node : nodes <= 4 ? dispatch_few_nodes : dispatch_nodes;
  }
  // A short search from the best start, which is above the balance cap: its
  // repair is what pays (a start within the cap is rarely beaten by a short
  // search, so none is run from one), mostly on the most imbalanced starts,
  // whose gap to the bound is widest.
  static constexpr double short_search = 0.05;
  // The full search, in the fixed layout (whose floor, the NIC's share of a
  // node's q rows, it cannot pass) and in the planned one (where it re-lays
  // out the documents across nodes; on one node the starts' dispatch already
  // does most of that).
  static constexpr double full_fixed = 0.3;
  static constexpr double full_planned_one_node = 0.35;
  static constexpr double full_planned_nodes = 0.75;
  static double full(bool planned, bool one_node) {
    return !planned ? full_fixed : one_node ? full_planned_one_node : full_planned_nodes;
  }
  // Two stages instead of one for the placement chosen (a pipelined cast and
  // a local tail, plan/builder.hpp), on one node and across nodes.
  static constexpr double stages_one_node = 0.4;
  static constexpr double stages_nodes = 0.15;
  // Static's dispatch on its own grid, one node: its one-stage plans are
  // slower than the search's model predicts, so two stages recover the whole
  // predicted gap.
  static constexpr double stages_static_one_node = 1.0;
  // The full solve again on grids of 2 and 4 times the blocks per rank
  // (fixed layout, across nodes).
  static constexpr double finer_grid = 0.2;
  // The full solve again under a balance cap of 1.03 on one node.
  static constexpr double tighter_cap = 0.3;
  // A search from the best candidate found (often a member's, within the
  // balance cap) priced against it, on one node; across nodes its one-stage
  // winner lost to its start at two stages.
  static constexpr double polish_one_node = 0.25;
  // Placements predicted within this fraction of the best are priced to
  // choose among them (the search's model misranks such near ties); beyond
  // it the prediction alone decides.
  static constexpr double near_tie = 0.05;
};

// Whether a phase pays for itself: weight x cost < gain x (best - bound).
inline bool worth(double cost_s, double weight, double gain_share, double best_s, double bound_s) {
  return weight * cost_s < gain_share * (best_s - bound_s);
}

}  // namespace cpsched::search
