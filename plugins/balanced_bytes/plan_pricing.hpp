#pragma once
// Time mode's judge: candidate placements ("finals") are priced as plans by
// the host's timing model (SolveInput::pricing); the fastest plan wins.
//
// A plan costs the host far more to price than a search step, so the pricer
//  * skips a job (final, stages, relay) whose step lower bound already
//    reaches the fastest step: it cannot win;
//  * prices jobs in batches of a fixed size, the batch's plans in parallel,
//    testing the bounds between batches, so that the plans priced (and the
//    choice) do not depend on the thread count;
//  * stops once the fastest step is within `settle` of the problem's compute
//    bound (all compute / P), which no plan's step is below;
//  * never prices a job twice.
#include <cstddef>
#include <limits>
#include <memory>
#include <tuple>
#include <vector>

#include <cpsched/plugin/pricing.hpp>

#include "balanced_bytes.hpp"

namespace cpsched::search {

class PlanPricer {
 public:
  // Plans priced in parallel between two tests of their step bounds (a fixed
  // number, so that the plans priced do not depend on the thread count).
  static constexpr std::size_t batch = 4;

  struct Job {
    std::size_t final_index;
    int stages, relay;
    double step = std::numeric_limits<double>::infinity();  // seconds; infinity: not priced
  };

  // relay_options: the relay node sizes to price (0: none); with two of them
  // a relayed plan that forwards nothing is not priced again.
  PlanPricer(PlanPricing& pricing, std::vector<int> relay_options, int threads, double settle);

  // Adds copies of the candidates not already in (same grid and placement),
  // asking for their step bounds in parallel.
  void add(const std::vector<const Candidate*>& candidates);

  // The finals from `from` on, lowest plain step bound first.
  std::vector<std::size_t> by_bound(std::size_t from = 0) const;

  // Prices the jobs (in this order) not priced or ruled out before; returns
  // them with their steps (infinity where not priced).
  std::vector<Job> price(std::vector<Job> jobs);

  bool settled() const { return compute_bound_ > 0 && best_.step <= (1 + settle_) * compute_bound_; }
  const std::vector<int>& relay_options() const { return relay_options_; }
  std::size_t size() const { return finals_.size(); }
  const Candidate& final_at(std::size_t i) const { return *finals_[i]; }
  // The fastest job priced so far (step infinity before any), ties to the earlier.
  const Job& best() const { return best_; }
  double compute_bound() const { return compute_bound_; }
  std::size_t priced() const { return priced_; }
  std::size_t skipped_by_bound() const { return skipped_by_bound_; }

 private:
  PlanPricing& pricing_;
  std::vector<int> relay_options_;
  int threads_;
  double settle_;
  std::vector<std::unique_ptr<const Candidate>> finals_;
  std::vector<PlanPricing::Placement> handles_;
  std::vector<StepBound> bounds_;
  std::vector<std::tuple<std::size_t, int, int>> done_;  // (final, stages, relay) priced or ruled out
  Job best_{0, 1, 0};
  double compute_bound_ = 0;
  std::size_t priced_ = 0, skipped_by_bound_ = 0;
};

}  // namespace cpsched::search
