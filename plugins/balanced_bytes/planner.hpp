#pragma once
// The time mode as a pipeline of phases.
//
// A TimePlanner plans one grid under one balance cap. It owns the pool of
// candidate placements, the ledger of each phase's predicted planning cost
// against its expected gain (effort.hpp) and the pricer of plans
// (plan_pricing.hpp), and runs one of three lists of phases, chosen in
// TimePlanner::path:
//  * huge: a grid above member_max_tasks used a few times (quick_huge.cpp):
//    the starts, the best balanced row by row, by prediction alone;
//  * quick: used a few times (quick_time.cpp): the starts as they are, then
//    only the phases that pay for their weighted time; where the full search
//    would pay, the full list runs instead, reusing the members solved;
//  * full: made ahead, or where it pays (full_time.cpp): members, searches,
//    plans priced, and the full solve repeated where that pays.
// Each list ends in an Outcome; write_result (result_writer.cpp) alone turns
// it into the Solution, its figures and its note.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <cpsched/plugin/solver.hpp>

#include "balanced_bytes.hpp"
#include "effort.hpp"
#include "kernel_pick.hpp"
#include "plan_pricing.hpp"
#include "cpsched/search/byte_model.hpp"
#include "cpsched/search/state.hpp"

namespace cpsched::search {

class MemberSolvers;

enum class TimePath { huge, quick, full };

// The plan chosen and how it was found: all that write_result needs.
struct Outcome {
  TimePath path = TimePath::full;
  Candidate best;  // (a copy: the planner that found it may be gone)
  double step = std::numeric_limits<double>::infinity();  // priced, else predicted
  PlanShape shape;                      // the solver's choice of what the host left open
  int relay = 0;                        // relay node size of the plan (0: none)
  std::optional<double> compute_bound;  // where plans were priced
  std::size_t candidates = 0, plans = 0, skipped_by_bound = 0;
  double cap_mu = 1.0;                  // the balance cap searched under
  std::string remarks;                  // the phases' remarks (what did not run, and why)
  // quick: what was taken unpriced, and the full search's cost declined.
  bool stages_unpriced = false, one_node = true;
  int relay_unpriced = 0;
  double full_cost = 0;
  // full: the pricer's stop near the compute bound, and the repetitions.
  bool settled = false, settled_early = false;
  std::optional<double> input_grid_step;  // the full solve's own step, before its repetitions
  std::string repeats;
  // Under a kernel model, made ahead: the fastest plan priced under it, and
  // how the search on the kernels' seconds compared.
  std::optional<AreasFirstPricing::Priced> kernel_pick;
  std::string closing;
};

// The Solution of `o` (feasible against opt.mu).
Solution write_result(Outcome o, const SolveInput& in, const Options& opt);

// What each phase is predicted to cost against what it is expected to gain
// (effort.hpp): a phase runs iff weight x cost < gain x (best - bound).
struct Ledger {
  double weight = 0;  // 1 / uses; 0 made ahead
  double bound = 0;   // the search's compute bound: no predicted step is below it
  PhaseCosts cost;
  int nodes = 1;
  bool one_node = true;
  double full_gain = 0;
  double members_cost = 0;  // the members run so far
  std::string remarks;      // the phases not run, and why
  bool pays(double cost_s, double gain, double best_s) const { return worth(cost_s, weight, gain, best_s, bound); }
};

// The placements a solve looks at, and the members' results.
struct Pool {
  std::vector<Candidate> candidates;
  std::size_t starts = 0;          // quick: the first `starts` candidates are the starts
  std::optional<Candidate> bytes;  // full: the bytes objective's best placement
  SolvedMembers solved;            // every member solved so far (the quick path's reused by the full)
  MembersRun members;              // full: the members' placements on this input
};

class TimePlanner {
 public:
  // mu: the balance cap searched under; member_tile: as member_names'.
  TimePlanner(const SolveInput& in, const Options& opt, MemberSolvers& members, double mu, std::int64_t member_tile);
  ~TimePlanner();
  TimePlanner(const TimePlanner&) = delete;
  TimePlanner& operator=(const TimePlanner&) = delete;

  // This input's path, with the full solve's repetitions where they pay.
  Outcome run();
  // The full path alone (a repetition's).
  Outcome run_full();

 private:
  enum class Next { go_on, full_pays };
  using Phase = Next (TimePlanner::*)();
  static const std::vector<Phase>& phases(TimePath path);
  TimePath path() const;
  Outcome run_path(TimePath path);
  const Candidate& best_predicted() const;

  // huge (quick_huge.cpp)
  Next huge_starts();
  Next balance_to_mean();
  Next choose_huge();
  // quick (quick_time.cpp)
  Next quick_starts();
  Next plan_short_search();
  Next quick_members();
  Next short_search();
  Next polish();
  Next price_near_ties();
  Next choose_stages_quick();
  int price_two_stages();
  Outcome quick_outcome(int stages, bool unpriced) const;
  std::optional<Candidate> search_from(const Candidate& from, std::int64_t moves, const std::string& suffix) const;
  Candidate predicted(std::string origin, std::shared_ptr<const TaskGrid> grid, std::vector<Rank> rank,
                      const ByteModel& model) const;
  void join_short_search();
  // full (full_time.cpp)
  Next full_members();
  Next search_input_grid();
  Next bytes_candidate();
  Next probe();
  Next member_grids();
  Next price_finalists();
  Next choose_stages_full();
  Next repeats();
  bool repeat_solve(double cost, double gain, const std::string& what, const SolveInput& on, double mu);
  void try_tighter_cap();
  void try_finer_grids();

  const SolveInput& in_;
  const Options& opt_;
  MemberSolvers& members_;
  const double mu_;
  const std::int64_t member_tile_;
  const int first_stages_;  // the host's stage count, 1 for auto: every plan is priced at it first
  bool repeat_ = true;      // the full path repeats the solve where that pays

  Pool pool_;
  Ledger ledger_;
  std::optional<PlanPricer> pricer_;
  Outcome out_;

  // quick and huge
  std::optional<ByteModel> model_;     // the input grid's
  std::optional<TimeObjective> to_;    // its per-rank time prices
  std::vector<std::string> names_;  // the members, those that dispatch first
  std::optional<Candidate> short_start_;
  std::optional<Candidate> short_found_;
  std::exception_ptr short_error_;
  std::thread beside_;  // the short search beside the members
  bool full_possible_ = false, polished_ = false, priced_ = false;
  const Candidate* best_ = nullptr;
  const Candidate* runner_up_ = nullptr;  // the second fastest priced
  double step_ = std::numeric_limits<double>::infinity(), compute_bound_ = 0;
  std::size_t plans_ = 0;
  int relay_ = 0;
  // full
  std::vector<int> relay_options_;
  std::vector<PlanPricer::Job> first_jobs_;  // the finals at the first stage count
  bool settled_early_ = false;
  std::string tried_;  // the repetitions' steps, or why each did not run
};

}  // namespace cpsched::search
