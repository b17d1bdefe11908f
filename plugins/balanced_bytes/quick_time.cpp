// The quick path's phases: the time mode when the planning time counts
// (uses >= 1, not ahead). The cheap starts as they are, then only the phases
// that pay for their own weighted time (effort.hpp); where the full search
// would pay, it runs instead (planner.hpp). Under a kernel model it runs on
// exact areas (time_mode.cpp), as its phases' costs and gains were measured.
#include "planner.hpp"
#include "time_mode.hpp"

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <thread>

#include "cpsched/base/parallel_for.hpp"
#include "cpsched/search/members.hpp"
#include "cpsched/search/placements.hpp"
#include "cpsched/search/predict.hpp"
#include "cpsched/search/search.hpp"

namespace cpsched::search {

namespace {

// Move evaluations of the short search (beside its repair, which is bounded
// on its own: search.hpp).
constexpr std::int64_t kShortSearchMoves = 250;

// Phases run on a second thread only where each is predicted to take at least
// this long: on small grids a thread's start and join, and on a busy machine
// its wait for a core, cost about what the overlap saves.
constexpr double kThreadMinS = 1e-3;

std::string ms(double s) { return num(s * 1e3, "%.3f"); }

bool dispatches(const std::string& member) { return member.rfind("static", 0) == 0; }

// On one node static's two-level dispatch is its one-level one.
bool repeats_one_level(const std::string& member, bool one_node) {
  return dispatches(member) && one_node && member.find("node_ranks=") != std::string::npos;
}

// All compute / P in the search's prices: no placement's predicted step is below it.
double predicted_compute_bound(const TaskGrid& grid, const TimeObjective& to) {
  return to.load_s * static_cast<double>(grid.total_load()) / grid.cp_size();
}

// The candidates, best predicted first (stable).
std::vector<const Candidate*> by_prediction(const std::vector<Candidate>& cands) {
  std::vector<const Candidate*> order;
  for (const Candidate& c : cands) order.push_back(&c);
  std::stable_sort(order.begin(), order.end(),
                   [](const Candidate* a, const Candidate* b) { return a->predicted_s < b->predicted_s; });
  return order;
}

// What is priced: the placements predicted within near_tie of the best start
// as it is (`first`), and the searched ones (the search's model can rank one
// ahead of a start whose plan is faster), each placement once.
std::vector<const Candidate*> near_ties(const std::vector<const Candidate*>& order, const Candidate& first) {
  std::vector<const Candidate*> to_price;
  for (const Candidate* c : order) {
    const bool repeat =
        std::any_of(to_price.begin(), to_price.end(), [&](const Candidate* p) { return same_placement(*p, *c); });
    const bool near = c->predicted_s <= (1 + PhaseGains::near_tie) * first.predicted_s;
    if (!repeat && (near || c->searched)) to_price.push_back(c);
  }
  return to_price;
}

}  // namespace

// A placement with its predicted step (the search's model, no plan built), in
// one pass without a State: the State's prediction, without its trees and
// lists, which only the short search needs (it builds its own, from one start).
Candidate TimePlanner::predicted(std::string origin, std::shared_ptr<const TaskGrid> grid, std::vector<Rank> rank,
                                 const ByteModel& model) const {
  const TimeObjective to = time_objective(*in_.time_prices(), *grid, opt_.spread);
  const std::int64_t excess = excess_load(*grid, rank, balance_cap(*grid, mu_));
  Candidate c{std::move(origin), std::move(rank), excess, 0.0, std::move(grid)};
  c.predicted_s = predict_max_rank_time(model, c.rank, to);
  return c;
}

// A short search from `from` on its own grid (repair, descent and an
// iterated search within `moves` evaluations), or nullopt where the search's
// model predicts no gain.
std::optional<Candidate> TimePlanner::search_from(const Candidate& from, std::int64_t moves,
                                                  const std::string& suffix) const {
  std::optional<ByteModel> own;
  if (&model_->grid() != from.grid.get()) own.emplace(*from.grid, 1.0, 1.0);
  const ByteModel& model = own ? *own : *model_;
  const TimeObjective to = time_objective(*in_.time_prices(), *from.grid, opt_.spread);
  State st(model, from.rank, balance_cap(*from.grid, mu_), 0.0, &to);
  Budget budget{moves};
  repair(st, budget);
  descend(st, budget);
  iterate(st, budget, opt_.seed);
  Candidate c{from.origin + suffix, st.placement(), st.excess(), st.objective(), from.grid, true};
  c.predicted_s = st.max_rank_time();
  if (c.predicted_s < from.predicted_s) return c;
  return std::nullopt;
}

// The starts (owner, usp, hybrid) predicted, and the ledger of this input.
TimePlanner::Next TimePlanner::quick_starts() {
  const TaskGrid& grid = *in_.grid();
  to_ = time_objective(*in_.time_prices(), grid, opt_.spread);
  const bool planned = grid.problem().layout == Layout::planned;
  ledger_.weight = in_.uses().planning_weight();
  ledger_.bound = predicted_compute_bound(grid, *to_);
  ledger_.cost = predict_phase_costs(grid.num_tasks(), grid.cp_size(), planned);
  ledger_.nodes = to_->nodes.node_of(grid.cp_size() - 1) + 1;
  ledger_.one_node = ledger_.nodes == 1;
  ledger_.full_gain = PhaseGains::full(planned, ledger_.one_node);
  model_.emplace(grid, 1.0, 1.0);
  std::vector<Candidate>& cands = pool_.candidates;
  cands.push_back(predicted("owner", in_.grid(), owner_placement(grid), *model_));
  if (grid.flattened()) {
    cands.push_back(predicted("usp", in_.grid(), usp_placement(grid, opt_.usp_max_degree), *model_));
    // hybrid takes owner's or usp's rows per q block: where it took the
    // same for all (one causal sequence), it is that start again.
    std::vector<Rank> hybrid = hybrid_placement(grid, opt_.usp_max_degree, to_->byte_s, to_->nodes.gpus_per_node);
    if (hybrid != cands[0].rank && hybrid != cands[1].rank)
      cands.push_back(predicted("hybrid", in_.grid(), std::move(hybrid), *model_));
  }
  pool_.starts = cands.size();
  return Next::go_on;
}

// The short search, from the best predicted start: where that start is above
// the balance cap its repair is what pays, and a member predicted ahead of it
// does not make it pay less. It depends on the starts alone, so with a second
// thread it runs beside the members, where the full search cannot follow:
// members only lower the best prediction, and at most all their costs come off
// the full search's.
TimePlanner::Next TimePlanner::plan_short_search() {
  names_ = member_names(in_, opt_, Objective::time, member_tile_);
  // Members that dispatch first: where they run (one node, planned layout)
  // their plans are the fastest, which leaves less for the others to gain.
  std::stable_partition(names_.begin(), names_.end(), dispatches);
  const PhaseCosts& cost = ledger_.cost;
  const auto starts_end = pool_.candidates.begin() + static_cast<std::ptrdiff_t>(pool_.starts);
  const Candidate& from = *std::min_element(pool_.candidates.begin(), starts_end, [](const auto& a, const auto& b) {
    return a.predicted_s < b.predicted_s;
  });
  // (Repairing to the cap can cost more bytes than it saves compute: its
  // result is kept only where the model predicts a gain.)
  if (from.excess > 0 && ledger_.pays(cost.short_search + cost.price_plan, PhaseGains::short_search, from.predicted_s))
    short_start_ = from;
  double all_members = 0;
  for (const std::string& name : names_)
    if (!repeats_one_level(name, ledger_.one_node)) all_members += dispatches(name) ? cost.dispatch : cost.member;
  full_possible_ = ledger_.pays(cost.full - all_members, ledger_.full_gain, best_predicted().predicted_s);
  if (short_start_ && !full_possible_ && opt_.threads > 1 && cost.short_search >= kThreadMinS &&
      cost.member >= kThreadMinS)
    beside_ = std::thread([this] {
      try {
        short_found_ = search_from(*short_start_, kShortSearchMoves, "+short");
      } catch (...) {
        short_error_ = std::current_exception();
      }
    });
  return Next::go_on;
}

// Each member that pays for its predicted time, those that dispatch first;
// then the full search, where it is expected to pay for itself.
TimePlanner::Next TimePlanner::quick_members() {
  const PhaseCosts& cost = ledger_.cost;
  const int nodes = ledger_.nodes;
  for (const std::string& name : names_) {
    if (repeats_one_level(name, ledger_.one_node)) continue;
    const double c = dispatches(name) ? cost.dispatch : cost.member;
    // On more than two nodes static's dispatch runs here only where the full
    // search cannot follow: that one solves the members itself, and their
    // predictions here (on static's finer grid) would be spent twice
    // (docs/bounds.md#the-default-solvers-phase-constants).
    const double dispatch_gain =
        nodes > 2 && full_possible_ ? PhaseGains::dispatch_nodes : PhaseGains::dispatch(nodes);
    const double gain = dispatches(name) ? dispatch_gain
                        : ledger_.one_node ? PhaseGains::member_one_node
                                           : PhaseGains::member_nodes;
    if (!ledger_.pays(c, gain, best_predicted().predicted_s)) {
      ledger_.remarks += "; member " + name + " not run (" + ms(c) + " ms predicted)";
      continue;
    }
    std::string why;
    std::optional<Solution> sol = members_.solve(name, in_, why);
    ledger_.members_cost += c;
    pool_.solved.got[name] = sol;
    pool_.solved.why[name] = why;
    if (!sol) {
      ledger_.remarks += "; member " + name + " skipped (" + why + ")";
      continue;
    }
    const bool own_grid = sol->assignment.grid.get() == in_.grid().get();
    std::optional<ByteModel> member_model;
    if (!own_grid) member_model.emplace(*sol->assignment.grid, 1.0, 1.0);
    pool_.candidates.push_back(predicted(name, sol->assignment.grid, std::move(sol->assignment.rank),
                                         own_grid ? *model_ : *member_model));
  }
  const bool full_pays =
      ledger_.pays(cost.full - ledger_.members_cost, ledger_.full_gain, best_predicted().predicted_s);
  return full_pays ? Next::full_pays : Next::go_on;
}

TimePlanner::Next TimePlanner::short_search() {
  if (beside_.joinable()) {
    beside_.join();
    if (short_error_) std::rethrow_exception(short_error_);
  } else if (short_start_) {
    short_found_ = search_from(*short_start_, kShortSearchMoves, "+short");
  }
  if (short_found_) pool_.candidates.push_back(std::move(*short_found_));
  return Next::go_on;
}

// On one node: a search from the best candidate so far, often a member's
// placement within the cap, which no start's short search reaches. Its plan is
// priced against that candidate's: the search's model misranks such near
// placements (docs/bounds.md#the-default-solvers-phase-constants).
TimePlanner::Next TimePlanner::polish() {
  if (!ledger_.one_node) return Next::go_on;
  const Candidate from = best_predicted();
  if (from.grid != in_.grid()) {
    // (Not on a member's own grid: there it cost more than predicted and found no faster plan.)
    ledger_.remarks += "; no polish (the best candidate is on " + from.origin + "'s own grid)";
  } else if (ledger_.pays(ledger_.cost.polish, PhaseGains::polish_one_node, from.predicted_s)) {
    if (std::optional<Candidate> c = search_from(from, kPolishMoves, "+polish")) {
      pool_.candidates.push_back(std::move(*c));
      polished_ = true;
    }
  } else {
    ledger_.remarks += "; no polish (" + ms(ledger_.cost.polish) + " ms predicted)";
  }
  return Next::go_on;
}

// The near ties priced at the first stage count where that pays (the polish
// paid for pricing its plan); else the best predicted start is taken. Relays
// (plan.relay auto) are taken across nodes without pricing them against none
// (docs/bounds.md#the-default-solvers-phase-constants).
TimePlanner::Next TimePlanner::price_near_ties() {
  relay_ = in_.shape().auto_relay() ? auto_relay_node(in_) : in_.shape().relay_node_size();
  const std::vector<const Candidate*> order = by_prediction(pool_.candidates);
  best_ = *std::find_if(order.begin(), order.end(), [](const Candidate* c) { return !c->searched; });
  const std::vector<const Candidate*> to_price = near_ties(order, *best_);
  priced_ = to_price.size() >= 2 &&
            (polished_ || ledger_.pays(static_cast<double>(to_price.size()) * ledger_.cost.price_plan,
                                       PhaseGains::price, best_predicted().predicted_s));
  if (!priced_) return Next::go_on;
  // The host prices different placements in parallel; the fastest is then
  // taken in the same order as one by one.
  std::vector<PlanPrice> prices(to_price.size());
  parallel_for(to_price.size(), ledger_.cost.price_plan >= kThreadMinS ? opt_.threads : 1, [&](std::size_t i) {
    const Candidate* c = to_price[i];
    prices[i] = in_.pricing()->price(in_.pricing()->add(c->grid, c->rank), PlanShape::fixed(first_stages_, relay_));
  });
  double second = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < to_price.size(); ++i) {
    const PlanPrice& p = prices[i];
    ++plans_;
    compute_bound_ = p.compute_bound;
    if (p.step < step_ * (1 - 1e-12)) {
      second = step_, runner_up_ = best_ == to_price[i] ? nullptr : best_;
      step_ = p.step, best_ = to_price[i];
    } else if (p.step < second * (1 - 1e-12)) {
      second = p.step, runner_up_ = to_price[i];
    }
  }
  return Next::go_on;
}

// Two stages pipeline the casts and end with a local tail that hides the
// reduces (plan/builder.hpp). Across nodes they are taken unpriced, with the
// ports' cut, where the plan alone pays (static's dispatch on its own grid
// keeps the priced test); on one node unpriced where the plan alone pays,
// static's dispatch too, except after a polish, whose runner-up can be faster
// at two stages (docs/bounds.md#the-default-solvers-phase-constants).
TimePlanner::Next TimePlanner::choose_stages_quick() {
  const bool one_node = ledger_.one_node;
  const bool static_dispatch = best_->origin.rfind("static", 0) == 0;
  const double gain = !one_node        ? PhaseGains::stages_nodes
                      : static_dispatch ? PhaseGains::stages_static_one_node
                                        : PhaseGains::stages_one_node;
  const double from = priced_ ? step_ : best_->predicted_s;
  const bool may_stage = in_.shape().auto_stages() && in_.pricing() != nullptr;
  const PhaseCosts& cost = ledger_.cost;
  const bool unpriced_pays = worth(cost.stages_unpriced, ledger_.weight, gain, from, ledger_.bound);
  const bool priced_pays =
      worth(cost.stages + (priced_ ? 0.0 : cost.price_plan), ledger_.weight, gain, from, ledger_.bound);
  if (may_stage && !one_node && (best_->grid == in_.grid() ? unpriced_pays : priced_pays))
    out_ = quick_outcome(2, true);
  else if (may_stage && one_node && !polished_ && unpriced_pays)
    out_ = quick_outcome(2, true);
  else if (may_stage && one_node && priced_pays)
    out_ = quick_outcome(price_two_stages(), false);
  else
    out_ = quick_outcome(first_stages_, false);
  return Next::go_on;
}

// The chosen placement priced at two stages (and at one where it was not
// priced); after a polish its runner-up too: a polished placement wins at one
// stage by compute and can lose to the candidate it came from once two stages
// hide that one's casts. The stage count of the fastest.
int TimePlanner::price_two_stages() {
  PlanPricing& pricing = *in_.pricing();
  const auto placement = pricing.add(best_->grid, best_->rank);
  if (!priced_) {
    const PlanPrice one = pricing.price(placement, PlanShape::fixed(1, relay_));
    step_ = one.step, compute_bound_ = one.compute_bound, ++plans_;
    priced_ = true;
  }
  int stages = first_stages_;
  const PlanPrice two = pricing.price(placement, PlanShape::fixed(2, relay_));
  ++plans_;
  if (two.step < step_) step_ = two.step, stages = 2;
  if (polished_ && runner_up_ != nullptr) {
    const PlanPrice other =
        pricing.price(pricing.add(runner_up_->grid, runner_up_->rank), PlanShape::fixed(2, relay_));
    ++plans_;
    if (other.step < step_) step_ = other.step, stages = 2, best_ = runner_up_;
  }
  return stages;
}

// (On one node the builder chooses the cut: the ports' cut was no faster there.)
Outcome TimePlanner::quick_outcome(int stages, bool unpriced) const {
  Outcome o;
  o.path = TimePath::quick;
  o.best = *best_;
  o.step = priced_ ? step_ : best_->predicted_s;
  o.shape = PlanShape::fixed(stages, relay_,
                             unpriced && !ledger_.one_node ? PlanShape::Cut::ports : PlanShape::Cut::automatic);
  o.relay = relay_;
  if (priced_) o.compute_bound = compute_bound_;
  o.candidates = pool_.candidates.size();
  o.plans = plans_;
  o.cap_mu = mu_;
  o.remarks = ledger_.remarks;
  o.stages_unpriced = unpriced;
  o.one_node = ledger_.one_node;
  o.relay_unpriced = in_.shape().auto_relay() ? relay_ : 0;
  o.full_cost = ledger_.cost.full;
  return o;
}

}  // namespace cpsched::search
