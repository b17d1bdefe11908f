#include "planner.hpp"

#include <algorithm>
#include <utility>

#include "time_mode.hpp"

namespace cpsched::search {

TimePlanner::TimePlanner(const SolveInput& in, const Options& opt, MemberSolvers& members, double mu,
                         std::int64_t member_tile)
    : in_(in), opt_(opt), members_(members), mu_(mu), member_tile_(member_tile),
      first_stages_(in.shape().auto_stages() ? 1 : in.shape().stages) {}

// The short search beside the members is joined on every way out (a member
// that throws included).
TimePlanner::~TimePlanner() { join_short_search(); }

void TimePlanner::join_short_search() {
  if (beside_.joinable()) beside_.join();
}

const std::vector<TimePlanner::Phase>& TimePlanner::phases(TimePath path) {
  static const std::vector<Phase> huge{&TimePlanner::huge_starts, &TimePlanner::balance_to_mean,
                                       &TimePlanner::choose_huge};
  static const std::vector<Phase> quick{&TimePlanner::quick_starts,    &TimePlanner::plan_short_search,
                                        &TimePlanner::quick_members,   &TimePlanner::short_search,
                                        &TimePlanner::polish,          &TimePlanner::price_near_ties,
                                        &TimePlanner::choose_stages_quick};
  static const std::vector<Phase> full{&TimePlanner::full_members,      &TimePlanner::search_input_grid,
                                       &TimePlanner::bytes_candidate,   &TimePlanner::probe,
                                       &TimePlanner::member_grids,      &TimePlanner::price_finalists,
                                       &TimePlanner::choose_stages_full, &TimePlanner::repeats};
  return path == TimePath::huge ? huge : path == TimePath::quick ? quick : full;
}

// Made ahead (weight 0) the full search always runs; used a few times, the
// quick path, or on a grid above member_max_tasks (where a State per start
// and a plan priced cost seconds) the huge one.
TimePath TimePlanner::path() const {
  if (in_.uses().planning_weight() <= 0) return TimePath::full;
  return in_.grid()->num_tasks() > opt_.member_max_tasks ? TimePath::huge : TimePath::quick;
}

Outcome TimePlanner::run() { return run_path(path()); }

Outcome TimePlanner::run_full() {
  repeat_ = false;
  return run_path(TimePath::full);
}

Outcome TimePlanner::run_path(TimePath path) {
  for (const Phase phase : phases(path)) {
    if ((this->*phase)() == Next::go_on) continue;
    // The full search pays: it runs instead, on the members solved so far
    // (their placements are searched again, a small part of it).
    join_short_search();
    pool_.candidates.clear();
    return run_path(TimePath::full);
  }
  return std::move(out_);
}

const Candidate& TimePlanner::best_predicted() const {
  const std::vector<Candidate>& c = pool_.candidates;
  return *std::min_element(c.begin(), c.end(),
                           [](const Candidate& a, const Candidate& b) { return a.predicted_s < b.predicted_s; });
}

}  // namespace cpsched::search
