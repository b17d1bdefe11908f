#include "plan_pricing.hpp"

#include <algorithm>

#include "cpsched/base/parallel_for.hpp"

namespace cpsched::search {

PlanPricer::PlanPricer(PlanPricing& pricing, std::vector<int> relay_options, int threads, double settle)
    : pricing_(pricing), relay_options_(std::move(relay_options)), threads_(threads), settle_(settle) {
  if (relay_options_.empty()) relay_options_.push_back(0);
  best_.relay = relay_options_.front();
}

void PlanPricer::add(const std::vector<const Candidate*>& candidates) {
  const std::size_t first = finals_.size();
  for (const Candidate* c : candidates) {
    const bool in = std::any_of(finals_.begin(), finals_.end(),
                                [&](const std::unique_ptr<const Candidate>& f) { return same_placement(*f, *c); });
    if (!in) finals_.push_back(std::make_unique<const Candidate>(*c));
  }
  for (std::size_t i = first; i < finals_.size(); ++i)
    handles_.push_back(pricing_.add(finals_[i]->grid, finals_[i]->rank));
  bounds_.resize(finals_.size());
  // The host computes each final's transfers for its bound (and keeps them
  // for its plans), the finals in parallel.
  parallel_for(finals_.size() - first, threads_, [&](std::size_t k) {
    const std::size_t i = first + k;
    bounds_[i] = pricing_.bound(handles_[i]);
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
    // One job list per final: the host prices one placement at a time.
    std::vector<std::vector<std::size_t>> by_final;
    for (std::size_t j : run) {
      auto it = std::find_if(by_final.begin(), by_final.end(), [&](const std::vector<std::size_t>& v) {
        return jobs[v.front()].final_index == jobs[j].final_index;
      });
      if (it == by_final.end()) by_final.push_back({j});
      else it->push_back(j);
    }
    std::vector<double> bound_of(jobs.size(), 0.0);
    parallel_for(by_final.size(), threads_, [&](std::size_t f) {
      for (std::size_t ji : by_final[f]) {
        Job& j = jobs[ji];
        const PlanPrice pp = pricing_.price(handles_[j.final_index], PlanShape::fixed(j.stages, j.relay));
        if (j.relay > 0 && choose_relay && !pp.forwards) continue;  // the plain plan again
        j.step = pp.step;
        bound_of[ji] = pp.compute_bound;
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
