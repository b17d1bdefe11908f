// The time mode when the planning time counts (uses >= 1, not ahead): the
// cheap starts as they are, then only the phases that pay for their own
// weighted time (effort.hpp); where the full search would pay, it runs.
// Under a kernel model it runs on exact areas (BalancedBytes::solve_time), as
// its phases' costs and gains were measured.
#include "balanced_bytes.hpp"
#include "effort.hpp"
#include "time_mode.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <thread>

#include "cpsched/base/parallel_for.hpp"
#include "cpsched/search/byte_model.hpp"
#include "cpsched/search/members.hpp"
#include "cpsched/search/placements.hpp"
#include "cpsched/search/predict.hpp"
#include "cpsched/search/search.hpp"
#include "cpsched/search/state.hpp"

namespace cpsched::search {

namespace {

// Move evaluations of the short search (beside its repair, which is bounded
// on its own: search.hpp).
constexpr std::int64_t kShortSearchMoves = 250;

// Phases run on a second thread only where each is predicted to take at least
// this long: on small grids a thread's start and join, and on a busy machine
// its wait for a core, cost about what the overlap saves.
constexpr double kThreadMinS = 1e-3;

std::string ms(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", s * 1e3);
  return buf;
}

// A placement with its predicted step (the search's model, no plan built), in
// one pass without a State: the State's prediction, without its trees and
// lists, which only the short search needs (it builds its own, from one start).
Candidate predicted(std::string origin, std::shared_ptr<const TaskGrid> grid, std::vector<Rank> rank,
                    const ByteModel& model, const TimePrices& prices, const Options& opt) {
  const TimeObjective to = time_objective(prices, *grid, opt.spread);
  const std::int64_t excess = excess_load(*grid, rank, balance_cap(*grid, opt.mu));
  Candidate c{std::move(origin), std::move(rank), excess, 0.0, std::move(grid)};
  c.predicted_s = predict_max_rank_time(model, c.rank, to);
  return c;
}

// A short search from `from` on its own grid (repair, descent and an
// iterated search within `moves` evaluations), or nullopt where the search's
// model predicts no gain. `input_model` is the input grid's, reused there.
std::optional<Candidate> search_from(const Candidate& from, std::int64_t moves, const std::string& suffix,
                                     const ByteModel& input_model, const TimePrices& prices, const Options& opt) {
  std::optional<ByteModel> own;
  if (&input_model.grid() != from.grid.get()) own.emplace(*from.grid, 1.0, 1.0);
  const ByteModel& model = own ? *own : input_model;
  const TimeObjective to = time_objective(prices, *from.grid, opt.spread);
  State st(model, from.rank, balance_cap(*from.grid, opt.mu), 0.0, &to);
  Budget budget{moves};
  repair(st, budget);
  descend(st, budget);
  iterate(st, budget, opt.seed);
  Candidate c{from.origin + suffix, st.placement(), st.excess(), st.objective(), from.grid, true};
  c.predicted_s = st.max_rank_time();
  if (c.predicted_s < from.predicted_s) return c;
  return std::nullopt;
}

// All compute / P in the search's prices: no placement's predicted step is below it.
double predicted_compute_bound(const TaskGrid& grid, const TimeObjective& to) {
  return to.load_s * static_cast<double>(grid.total_load()) / grid.cp_size();
}

}  // namespace

std::optional<Solution> BalancedBytes::solve_time_quick(const SolveInput& in, SolvedMembers& solved) const {
  const double weight = in.uses().planning_weight();
  const TaskGrid& grid = *in.grid();
  if (weight <= 0) return std::nullopt;
  if (grid.num_tasks() > opt_.member_max_tasks) return solve_time_huge(in);
  const TimePrices& prices = *in.time_prices();
  const TimeObjective to = time_objective(prices, grid, opt_.spread);
  const double bound = predicted_compute_bound(grid, to);
  const PhaseCosts cost = predict_phase_costs(grid.num_tasks(), grid.cp_size(), grid.problem().layout == Layout::planned);

  const ByteModel model(grid, 1.0, 1.0);
  std::vector<Candidate> cands;
  cands.push_back(predicted("owner", in.grid(), owner_placement(grid), model, prices, opt_));
  if (grid.flattened()) {
    cands.push_back(predicted("usp", in.grid(), usp_placement(grid, opt_.usp_max_degree), model, prices, opt_));
    // hybrid takes owner's or usp's rows per q block: where it took the
    // same for all (one causal sequence), it is that start again.
    std::vector<Rank> hybrid = hybrid_placement(grid, opt_.usp_max_degree, to.byte_s, to.nodes.gpus_per_node);
    if (hybrid != cands[0].rank && hybrid != cands[1].rank)
      cands.push_back(predicted("hybrid", in.grid(), std::move(hybrid), model, prices, opt_));
  }
  const std::size_t starts = cands.size();
  const auto by_predicted = [](const Candidate& a, const Candidate& b) { return a.predicted_s < b.predicted_s; };
  auto best_predicted = [&]() -> const Candidate& {
    return *std::min_element(cands.begin(), cands.end(), by_predicted);
  };

  std::string note;
  double members_cost = 0;  // predicted seconds of the members run here
  const int nodes = to.nodes.node_of(grid.cp_size() - 1) + 1;
  const bool one_node = nodes == 1;
  const double full_gain = PhaseGains::full(grid.problem().layout == Layout::planned, one_node);
  // Members that dispatch first: where they run (one node, planned layout)
  // their plans are the fastest, which leaves less for the others to gain.
  std::vector<std::string> names = member_names(in);
  std::stable_partition(names.begin(), names.end(), [](const std::string& n) { return n.rfind("static", 0) == 0; });
  // (On one node static's two-level dispatch is its one-level one.)
  auto member_skipped = [&](const std::string& name) {
    return name.rfind("static", 0) == 0 && one_node && name.find("node_ranks=") != std::string::npos;
  };

  // The short search, from the best predicted start (owner, usp, hybrid):
  // where that start is above the balance cap its repair is what pays, and a
  // member predicted ahead of it does not make it pay less.
  const auto from_index = static_cast<std::size_t>(
      std::min_element(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(starts), by_predicted) -
      cands.begin());
  const bool short_runs =
      cands[from_index].excess > 0 && worth(cost.short_search + cost.price_plan, weight, PhaseGains::short_search,
                                            cands[from_index].predicted_s, bound);
  // (Its start is copied: the members' candidates are appended to `cands`
  // meanwhile. Repairing to the cap can cost more bytes than it saves
  // compute: priced only where the model predicts a gain.)
  auto short_search = [&, start = cands[from_index]]() {
    return search_from(start, kShortSearchMoves, "+short", model, prices, opt_);
  };
  // It depends on the starts alone, so with a second thread it runs beside
  // the members, where the full search cannot follow: members only lower the
  // best prediction, and at most all their costs come off the full search's.
  double all_members = 0;
  for (const std::string& name : names)
    if (!member_skipped(name)) all_members += name.rfind("static", 0) == 0 ? cost.dispatch : cost.member;
  const bool full_possible =
      worth(cost.full - all_members, weight, full_gain, best_predicted().predicted_s, bound);
  std::optional<Candidate> short_found;
  std::exception_ptr short_error;
  std::thread beside;
  if (short_runs && !full_possible && opt_.threads > 1 && cost.short_search >= kThreadMinS &&
      cost.member >= kThreadMinS)
    beside = std::thread([&] {
      try {
        short_found = short_search();
      } catch (...) {
        short_error = std::current_exception();
      }
    });
  // Joined on every way out (a member that throws included).
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join{beside};

  for (const std::string& name : names) {
    const bool dispatches = name.rfind("static", 0) == 0;
    if (member_skipped(name)) continue;
    const double c = dispatches ? cost.dispatch : cost.member;
    // On more than two nodes static's dispatch runs here only where the full
    // search cannot follow: that one solves the members itself, and their
    // predictions here (on static's finer grid) would be spent twice (at P =
    // 32 the full search then ran on every pack, used 8 and 32 times).
    const double dispatch_gain =
        nodes > 2 && full_possible ? PhaseGains::dispatch_nodes : PhaseGains::dispatch(nodes);
    const double gain =
        dispatches ? dispatch_gain : (one_node ? PhaseGains::member_one_node : PhaseGains::member_nodes);
    if (!worth(c, weight, gain, best_predicted().predicted_s, bound)) {
      note += "; member " + name + " not run (" + ms(c) + " ms predicted)";
      continue;
    }
    std::string why;
    std::optional<Solution> sol = members_->solve(name, in, why);
    members_cost += c;
    solved.got[name] = sol;
    solved.why[name] = why;
    if (!sol) {
      note += "; member " + name + " skipped (" + why + ")";
      continue;
    }
    const bool own_grid = sol->assignment.grid.get() == in.grid().get();
    std::optional<ByteModel> member_model;
    if (!own_grid) member_model.emplace(*sol->assignment.grid, 1.0, 1.0);
    cands.push_back(predicted(name, sol->assignment.grid, std::move(sol->assignment.rank),
                              own_grid ? model : *member_model, prices, opt_));
  }

  // Where the full search is expected to pay for itself, it runs (the members
  // run here are not solved again; the starts are priced again, a small part of it).
  if (worth(cost.full - members_cost, weight, full_gain, best_predicted().predicted_s, bound))
    return std::nullopt;

  const int stages = in.shape().auto_stages() ? 1 : in.shape().stages;
  // Relays (plan.relay auto) are taken across nodes without pricing them
  // against none, as the two stages below: on average the used-once plans
  // with them cost at most 0.3 % more per use, and up to 9 % less, at P =
  // 16-128 (docs/bounds.md#uses-and-effort).
  const int relay_node = in.shape().auto_relay() ? auto_relay_node(in) : 0;
  const bool relays_unpriced = relay_node > 0;
  const int relay = in.shape().auto_relay() ? relay_node : in.shape().relay_node_size();
  if (beside.joinable()) {
    beside.join();
    if (short_error) std::rethrow_exception(short_error);
  } else if (short_runs) {
    short_found = short_search();
  }
  if (short_found) cands.push_back(std::move(*short_found));

  // The polish, on one node: a search from the best candidate so far, often
  // a member's placement within the cap, which no start's short search
  // reaches. Its plan is priced against that candidate's: the search's model
  // misranks such near placements (across nodes it lost at two stages:
  // effort.hpp).
  bool polished = false;
  if (one_node) {
    const Candidate from = best_predicted();
    // (Not on a member's own grid: on static's chunks, in the planned layout,
    // it cost 4x its prediction and found no faster plan.)
    if (from.grid != in.grid()) {
      note += "; no polish (the best candidate is on " + from.origin + "'s own grid)";
    } else if (worth(cost.polish, weight, PhaseGains::polish_one_node, from.predicted_s, bound)) {
      if (std::optional<Candidate> c = search_from(from, kPolishMoves, "+polish", model, prices, opt_)) {
        cands.push_back(std::move(*c));
        polished = true;
      }
    } else {
      note += "; no polish (" + ms(cost.polish) + " ms predicted)";
    }
  }

  // Pricing: the placements predicted within near_tie of the best, and the
  // short search's (it competes only priced: the search's model can rank it
  // ahead of a start whose plan is faster), each placement once.
  std::vector<const Candidate*> order;
  for (const Candidate& c : cands) order.push_back(&c);
  std::stable_sort(order.begin(), order.end(),
                   [](const Candidate* a, const Candidate* b) { return a->predicted_s < b->predicted_s; });
  const Candidate* first_start = nullptr;  // the best predicted placement as it is
  for (const Candidate* c : order)
    if (!c->searched) {
      first_start = c;
      break;
    }
  std::vector<const Candidate*> to_price;
  for (const Candidate* c : order) {
    const bool repeat =
        std::any_of(to_price.begin(), to_price.end(), [&](const Candidate* p) { return same_placement(*p, *c); });
    const bool near = c->predicted_s <= (1 + PhaseGains::near_tie) * first_start->predicted_s;
    if (!repeat && (near || c->searched)) to_price.push_back(c);
  }
  // (The polish paid for pricing its plan.)
  bool priced = to_price.size() >= 2 &&
                (polished || worth(static_cast<double>(to_price.size()) * cost.price_plan, weight,
                                   PhaseGains::price, best_predicted().predicted_s, bound));
  double step = std::numeric_limits<double>::infinity(), compute_bound = 0;
  std::size_t plans = 0;
  const Candidate* best = first_start;
  const Candidate* runner_up = nullptr;  // the second fastest priced
  if (priced) {
    // The host prices different placements in parallel; the fastest is then
    // taken in the same order as one by one.
    std::vector<PlanPrice> prices_of(to_price.size());
    parallel_for(to_price.size(), cost.price_plan >= kThreadMinS ? opt_.threads : 1, [&](std::size_t i) {
      const Candidate* c = to_price[i];
      prices_of[i] = in.pricing()->price(in.pricing()->add(c->grid, c->rank), PlanShape::fixed(stages, relay));
    });
    double second = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < to_price.size(); ++i) {
      const PlanPrice& p = prices_of[i];
      ++plans;
      compute_bound = p.compute_bound;
      if (p.step < step * (1 - 1e-12)) {
        second = step, runner_up = best == to_price[i] ? nullptr : best;
        step = p.step, best = to_price[i];
      } else if (p.step < second * (1 - 1e-12)) {
        second = p.step, runner_up = to_price[i];
      }
    }
  }

  // Two stages pipeline the casts and end with a local tail that hides the
  // reduces (plan/builder.hpp). Unpriced, they cost a rank's two-stage plan
  // (every rank's transfers); priced, also the pricing (and the placement at
  // one stage, when it was not priced). Across nodes they are taken unpriced,
  // with the ports' cut, where the plan alone pays: there two stages were
  // never slower than one on the placements measured, and the ports' cut
  // slower than the receivers' on 1 of 120, by 2.2 %
  // (docs/bounds.md#uses-and-effort), while pricing them cost 2-10 % of the
  // bound at P = 16-64, and the host's choice of the cut about 0.7 ms of each
  // rank's plan at P = 32 (static's dispatch on its own grid keeps the
  // priced test: at two stages it was slower on 9 of 20 packs at P = 16). On
  // one node they are taken unpriced where the plan alone pays, static's
  // dispatch too: the default's placements were faster at two stages on all
  // 40 document packs at P = 8 (usp's on 39), and pricing never chose
  // otherwise on static's grid there. A polished placement is priced, as its
  // runner-up can be faster at two stages.
  int chosen_stages = stages;
  bool stages_unpriced = false;
  const bool static_dispatch = best->origin.rfind("static", 0) == 0;
  const double stages_gain = !one_node        ? PhaseGains::stages_nodes
                             : static_dispatch ? PhaseGains::stages_static_one_node
                                               : PhaseGains::stages_one_node;
  const double stages_from = priced ? step : best->predicted_s;
  const bool may_stage = in.shape().auto_stages() && in.pricing() != nullptr;
  const bool unpriced_pays = worth(cost.stages_unpriced, weight, stages_gain, stages_from, bound);
  const bool priced_pays =
      worth(cost.stages + (priced ? 0.0 : cost.price_plan), weight, stages_gain, stages_from, bound);
  if (may_stage && !one_node && (best->grid == in.grid() ? unpriced_pays : priced_pays)) {
    chosen_stages = 2;
    stages_unpriced = true;
  } else if (may_stage && one_node && !polished && unpriced_pays) {
    chosen_stages = 2;
    stages_unpriced = true;
  } else if (may_stage && one_node && priced_pays) {
    const auto placement = in.pricing()->add(best->grid, best->rank);
    if (!priced) {
      const PlanPrice one = in.pricing()->price(placement, PlanShape::fixed(1, relay));
      step = one.step, compute_bound = one.compute_bound, ++plans;
      priced = true;
    }
    const PlanPrice two = in.pricing()->price(placement, PlanShape::fixed(2, relay));
    ++plans;
    if (two.step < step) step = two.step, chosen_stages = 2;
    // A polished placement wins at one stage by compute and can lose to the
    // candidate it came from once two stages hide that one's casts.
    if (polished && runner_up != nullptr) {
      const PlanPrice other = in.pricing()->price(in.pricing()->add(runner_up->grid, runner_up->rank),
                                                  PlanShape::fixed(2, relay));
      ++plans;
      if (other.step < step) step = other.step, chosen_stages = 2, best = runner_up;
    }
  }

  Solution sol;
  sol.assignment.grid = best->grid;
  sol.assignment.rank = best->rank;
  sol.feasible = balance_cap(*best->grid, opt_.mu) >= max_load(*best->grid, best->rank);
  // (On one node the builder chooses the cut: the ports' cut was no faster
  // there, and slower per use on 3-7 of 20 packs used once at P = 8.)
  sol.shape = PlanShape::fixed(chosen_stages, relay,
                               stages_unpriced && !one_node ? PlanShape::Cut::ports : PlanShape::Cut::automatic);
  sol.figures.set("predicted_step_s", priced ? step : best->predicted_s);
  if (priced) sol.figures.set("compute_bound_s", compute_bound);
  sol.figures.set("candidates", static_cast<double>(cands.size()));
  sol.figures.set("plans_priced", static_cast<double>(plans));
  sol.figures.set("stages", chosen_stages);
  sol.figures.set("relay_node_size", relay);
  sol.figures.set("blocks_per_rank", best->grid->problem().grid.blocks_per_rank);
  sol.figures.set("full_search", 0);
  std::string how = "by the search's model";
  if (priced) how = std::to_string(plans) + " plans priced";
  if (stages_unpriced) how += one_node ? ", 2 stages unpriced" : ", 2 stages and the ports' cut unpriced";
  if (relays_unpriced) how += ", relays on nodes of " + std::to_string(relay_node) + " (not priced against none)";
  sol.note = "balanced_bytes (time): " + best->origin + " on " +
             std::to_string(best->grid->problem().grid.blocks_per_rank) + " block(s) per rank, " +
             std::to_string(chosen_stages) + " stage(s), predicted step " + ms(priced ? step : best->predicted_s) +
             (stages_unpriced ? " ms at 1 stage " : " ms ");
  sol.note += how;
  sol.note += "; planned for " + in.uses().str() + " use(s): no full search (" + ms(cost.full) +
              " ms of planning predicted, more than it is expected to save)";
  sol.note += note;
  if (!sol.feasible) {
    char mu[32];
    std::snprintf(mu, sizeof mu, "%g", opt_.mu);
    sol.note += std::string("; the chosen plan is above mu = ") + mu;
  }
  return sol;
}

}  // namespace cpsched::search
