#include "plan_pricing.hpp"

#include <algorithm>

#include <cpsched/base/error.hpp>

#include "run_jobs.hpp"

namespace cpsched::search {

PlanPricer::PlanPricer(const CostModel& cost, std::vector<int> relay_options, int threads, double settle)
    : cost_(cost), relay_options_(std::move(relay_options)), threads_(threads), settle_(settle) {
  const auto tp = cost.time_prices();
  if (!tp) throw Error("balanced_bytes: pricing plans needs a cost model that prices time");
  prices_ = *tp;
  if (relay_options_.empty()) relay_options_.push_back(0);
  best_.relay = relay_options_.front();
}

PlanPricer::~PlanPricer() = default;

void PlanPricer::add(const std::vector<const Candidate*>& candidates) {
  const std::size_t first = finals_.size();
  for (const Candidate* c : candidates) {
    const bool in = std::any_of(finals_.begin(), finals_.end(),
                                [&](const std::unique_ptr<const Candidate>& f) { return same_placement(*f, *c); });
    if (!in) finals_.push_back(std::make_unique<const Candidate>(*c));
  }
  builders_.resize(finals_.size());
  bounds_.resize(finals_.size());
  // Each final's builder (its transfers and send orders, reused by all its
  // plans) gives the transfers of its bound too.
  run_jobs(finals_.size() - first, threads_, [&](std::size_t k) {
    const std::size_t i = first + k;
    Assignment a;
    a.grid = finals_[i]->grid;
    a.rank = finals_[i]->rank;
    builders_[i] = std::make_unique<PlanBuilder>(std::move(a));
    bounds_[i] = step_lower_bound(*finals_[i]->grid, finals_[i]->rank, builders_[i]->transfers(), prices_,
                                  relay_options_.back());
  });
}

std::vector<std::size_t> PlanPricer::by_bound(std::size_t from) const {
  std::vector<std::size_t> order;
  for (std::size_t i = from; i < finals_.size(); ++i) order.push_back(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t x, std::size_t y) { return bounds_[x].plain < bounds_[y].plain; });
  return order;
}

std::vector<PlanPricer::Job> PlanPricer::price(std::vector<Job> jobs) {
  const bool choose_relay = relay_options_.size() > 1;  // (else a relayed plan without forwarding is the plan)
  std::erase_if(jobs, [&](const Job& j) {
    return std::find(done_.begin(), done_.end(), std::make_tuple(j.final_index, j.stages, j.relay)) != done_.end();
  });
  for (std::size_t b0 = 0; b0 < jobs.size() && !settled(); b0 += batch) {
    const std::size_t b1 = std::min(jobs.size(), b0 + batch);
    std::vector<std::size_t> run;
    for (std::size_t j = b0; j < b1; ++j) {
      const StepBound& sb = bounds_[jobs[j].final_index];
      const bool useless = jobs[j].relay > 0 && choose_relay && !sb.may_forward;  // the plain plan again
      const double lb = jobs[j].relay > 0 ? sb.relayed : sb.plain;
      done_.emplace_back(jobs[j].final_index, jobs[j].stages, jobs[j].relay);
      if (useless || lb >= best_.step) ++skipped_by_bound_;
      else run.push_back(j);
    }
    // One job list per final: a builder is used by one thread at a time.
    std::vector<std::vector<std::size_t>> by_final;
    for (std::size_t j : run) {
      auto it = std::find_if(by_final.begin(), by_final.end(), [&](const std::vector<std::size_t>& v) {
        return jobs[v.front()].final_index == jobs[j].final_index;
      });
      if (it == by_final.end()) by_final.push_back({j});
      else it->push_back(j);
    }
    std::vector<double> bound_of(jobs.size(), 0.0);
    run_jobs(by_final.size(), threads_, [&](std::size_t f) {
      for (std::size_t ji : by_final[f]) {
        Job& j = jobs[ji];
        const PlanBuilder& b = *builders_[j.final_index];
        // Priced, not run: one area-only arg per rank and stage.
        const Plan plan = b.build(PlanOptions{j.stages, j.relay, /*index_rows=*/false, /*area_only=*/true});
        if (j.relay > 0 && choose_relay && !plan.has_forwarding()) continue;  // the plain plan again
        const StepEstimate e = *cost_.plan_time(finals_[j.final_index]->grid->problem(), plan);
        j.step = e.step();
        bound_of[ji] = e.compute_bound;
      }
    });
    priced_ += run.size();
    for (std::size_t j : run) {
      if (compute_bound_ == 0) compute_bound_ = bound_of[j];
      if (jobs[j].step < best_.step * (1 - 1e-12)) best_ = jobs[j];
    }
  }
  return jobs;
}

}  // namespace cpsched::search
