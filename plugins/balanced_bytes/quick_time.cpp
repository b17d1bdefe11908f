// The time mode when the planning time counts (uses >= 1, not ahead): the
// cheap starts as they are, then only the phases that pay for their own
// weighted time (effort.hpp); where the full search would pay, it runs.
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
#include <tuple>

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

// The search's prices with compute on the tasks' exact areas at the peak
// rate, not the kernel model's.
TimeObjective on_areas(TimeObjective to) {
  to.kernel.reset();
  return to;
}

// Whether the effort model's tests read the gap on exact areas (Candidate::
// effort_s): under a kernel model, across nodes (see solve_time_quick).
bool effort_on_areas(const TimeObjective& to, const TaskGrid& grid) {
  return to.kernel && to.nodes.node_of(grid.cp_size() - 1) > 0;
}

// The input grid's time objective, made once: under a kernel model making
// one looks the grid's task seconds up (a hash over its cells).
struct InputObjective {
  const TaskGrid* grid;
  const TimeObjective* to;
  TimeObjective of(const TaskGrid& g, const TimePrices& prices, const Options& opt) const {
    return &g == grid ? *to : time_objective(prices, g, opt.spread);
  }
};

// A placement with its predicted step (the search's model, no plan built), in
// one pass without a State: the State's prediction, without its trees and
// lists, which only the short search needs (it builds its own, from one start).
Candidate predicted(std::string origin, std::shared_ptr<const TaskGrid> grid, std::vector<Rank> rank,
                    const ByteModel& model, const TimePrices& prices, const Options& opt, const InputObjective& input) {
  const TimeObjective to = input.of(*grid, prices, opt);
  const std::int64_t excess = excess_load(*grid, rank, balance_cap(*grid, opt.mu));
  Candidate c{std::move(origin), std::move(rank), excess, 0.0, std::move(grid)};
  if (effort_on_areas(to, *c.grid)) {
    std::tie(c.predicted_s, c.effort_s) = predict_max_rank_times(model, c.rank, to);
  } else {
    c.predicted_s = c.effort_s = predict_max_rank_time(model, c.rank, to);
  }
  return c;
}

// A short search from `from` on its own grid (repair, descent and an
// iterated search within `moves` evaluations), or nullopt where the search's
// model predicts no gain. `input_model` is the input grid's, reused there.
// exact_area: compute priced on the tasks' exact area at the peak rate, not
// the kernel model's (the same start descends elsewhere: a second candidate).
std::optional<Candidate> search_from(const Candidate& from, std::int64_t moves, const std::string& suffix,
                                     const ByteModel& input_model, const TimePrices& prices, const Options& opt,
                                     const InputObjective& input, bool exact_area = false) {
  std::optional<ByteModel> own;
  if (&input_model.grid() != from.grid.get()) own.emplace(*from.grid, 1.0, 1.0);
  const ByteModel& model = own ? *own : input_model;
  const TimeObjective to = input.of(*from.grid, prices, opt);
  const TimeObjective area = on_areas(to);
  State st(model, from.rank, balance_cap(*from.grid, opt.mu), 0.0, exact_area ? &area : &to);
  Budget budget{moves};
  repair(st, budget);
  descend(st, budget);
  iterate(st, budget, opt.seed);
  Candidate c{from.origin + suffix, st.placement(), st.excess(), st.objective(), from.grid, true};
  // (Predicted as every candidate is, on the kernels' seconds, and on exact areas.)
  c.predicted_s = exact_area ? predict_max_rank_time(model, c.rank, to) : st.max_rank_time();
  c.effort_s = !effort_on_areas(to, *from.grid) ? c.predicted_s
               : exact_area                        ? st.max_rank_time()
                                                   : predict_max_rank_time(model, c.rank, area);
  if (c.predicted_s < from.predicted_s) return c;
  return std::nullopt;
}

// All compute / P in the search's prices: no placement's predicted step is
// below it. (Under a kernel model: all the tasks' kernel seconds / P.)
double predicted_compute_bound(const TaskGrid& grid, const TimeObjective& to) {
  if (!to.kernel) return to.load_s * static_cast<double>(grid.total_load()) / grid.cp_size();
  double total = 0;
  for (TaskId t = 0; t < grid.num_tasks(); ++t) total += to.kernel->both[to.kernel->unit_of(t)];
  return total / grid.cp_size();
}

}  // namespace

std::optional<Solution> BalancedBytes::solve_time_quick(const SolveInput& in, SolvedMembers& solved) const {
  const double weight = in.uses().planning_weight();
  const TaskGrid& grid = *in.grid();
  if (weight <= 0) return std::nullopt;
  if (grid.num_tasks() > opt_.member_max_tasks) return solve_time_huge(in);
  const TimePrices& prices = *in.time_prices();
  const TimeObjective to = time_objective(prices, grid, opt_.spread);
  // The effort model's gains are shares of the gap between a placement's
  // predicted step and the compute bound as they were measured, on exact
  // areas at the peak rate. Across nodes its tests read that gap
  // (Candidate::effort_s) under a kernel model too, so the same phases run:
  // on the kernels' gaps static's members were skipped where they ran there,
  // and the plans were slower (planned layout, used once, causal_document at
  // P = 32: 2 % on average, one pack 25 %). On one node the kernels' gaps ran
  // more members and polishes that paid (P = 8: 4 % faster on average,
  // against 1 % slower on the areas' gaps): there the tests read the
  // kernels' gap. The kernel model ranks and prices either way
  // (docs/bounds.md).
  const double effort_bound = predicted_compute_bound(grid, effort_on_areas(to, grid) ? on_areas(to) : to);
  const PhaseCosts cost = predict_phase_costs(grid.num_tasks(), grid.cp_size(), grid.problem().layout == Layout::planned);

  const ByteModel model(grid, 1.0, 1.0);
  std::vector<Candidate> cands;
  const InputObjective input{&grid, &to};
  cands.push_back(predicted("owner", in.grid(), owner_placement(grid), model, prices, opt_, input));
  if (grid.flattened()) {
    cands.push_back(predicted("usp", in.grid(), usp_placement(grid, opt_.usp_max_degree), model, prices, opt_, input));
    // hybrid takes owner's or usp's rows per q block: where it took the
    // same for all (one causal sequence), it is that start again.
    std::vector<Rank> hybrid = hybrid_placement(grid, opt_.usp_max_degree, to.byte_s, to.nodes.gpus_per_node);
    if (hybrid != cands[0].rank && hybrid != cands[1].rank)
      cands.push_back(predicted("hybrid", in.grid(), std::move(hybrid), model, prices, opt_, input));
  }
  const std::size_t starts = cands.size();
  const auto by_effort = [](const Candidate& a, const Candidate& b) { return a.effort_s < b.effort_s; };
  auto best_effort = [&]() -> const Candidate& { return *std::min_element(cands.begin(), cands.end(), by_effort); };

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
    return name.rfind("static", 0) == 0 && one_node && name != "static";
  };

  // The short search, from the best predicted start (owner, usp, hybrid):
  // where that start is above the balance cap its repair is what pays, and a
  // member predicted ahead of it does not make it pay less.
  const auto from_index = static_cast<std::size_t>(
      std::min_element(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(starts), by_effort) -
      cands.begin());
  const bool short_runs =
      cands[from_index].excess > 0 && worth(cost.short_search + cost.price_plan, weight, PhaseGains::short_search,
                                            cands[from_index].effort_s, effort_bound);
  // (Its start is copied: the members' candidates are appended to `cands`
  // meanwhile. Repairing to the cap can cost more bytes than it saves
  // compute: priced only where the model predicts a gain.)
  // Under a kernel model it runs twice, on the kernels' seconds and on the
  // exact areas: the two descend to different local optima, and the pricing
  // takes the faster plan (on the standard workload the better of the two
  // was 1-2 % faster than either; on exact areas alone 2.7 % faster at P =
  // 128, on the kernels' alone 1-3 % at P = 16-64: docs/bounds.md). The
  // second run costs what the first does and gains about as much again, so
  // the test above stays the first's.
  // (The two run side by side where there are threads: the same results.)
  auto short_search = [&, start = cands[from_index]]() {
    std::optional<Candidate> runs[2];
    parallel_for(prices.kernel ? 2 : 1, cost.short_search >= kThreadMinS ? opt_.threads : 1, [&](std::size_t i) {
      runs[i] =
          search_from(start, kShortSearchMoves, i == 0 ? "+short" : "+short(area)", model, prices, opt_, input, i == 1);
    });
    std::vector<Candidate> found;
    for (std::optional<Candidate>& c : runs)
      if (c) found.push_back(std::move(*c));
    return found;
  };
  // It depends on the starts alone, so with a second thread it runs beside
  // the members, where the full search cannot follow: members only lower the
  // best prediction, and at most all their costs come off the full search's.
  double all_members = 0;
  for (const std::string& name : names)
    if (!member_skipped(name)) all_members += name.rfind("static", 0) == 0 ? cost.dispatch : cost.member;
  const bool full_possible =
      worth(cost.full - all_members, weight, full_gain, best_effort().effort_s, effort_bound);
  std::vector<Candidate> short_found;
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
    if (!worth(c, weight, gain, best_effort().effort_s, effort_bound)) {
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
                              own_grid ? model : *member_model, prices, opt_, input));
  }

  // Where the full search is expected to pay for itself, it runs (the members
  // run here are not solved again; the starts are priced again, a small part of it).
  if (worth(cost.full - members_cost, weight, full_gain, best_effort().effort_s, effort_bound))
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
  for (Candidate& c : short_found) cands.push_back(std::move(c));

  // The polish, on one node: a search from the best candidate so far, often
  // a member's placement within the cap, which no start's short search
  // reaches. Its plan is priced against that candidate's: the search's model
  // misranks such near placements (across nodes it lost at two stages:
  // effort.hpp).
  bool polished = false;
  if (one_node) {
    const Candidate from = best_effort();
    // (Not on a member's own grid: on static's chunks, in the planned layout,
    // it cost 4x its prediction and found no faster plan.)
    if (from.grid != in.grid()) {
      note += "; no polish (the best candidate is on " + from.origin + "'s own grid)";
    } else if (worth(cost.polish, weight, PhaseGains::polish_one_node, from.effort_s, effort_bound)) {
      if (std::optional<Candidate> c = search_from(from, kPolishMoves, "+polish", model, prices, opt_, input)) {
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
  double first_effort = std::numeric_limits<double>::infinity();  // the best effort_s of one as it is
  for (const Candidate* c : order)
    if (!c->searched) {
      if (!first_start) first_start = c;
      first_effort = std::min(first_effort, c->effort_s);
    }
  std::vector<const Candidate*> to_price;
  for (const Candidate* c : order) {
    const bool repeat =
        std::any_of(to_price.begin(), to_price.end(), [&](const Candidate* p) { return same_placement(*p, *c); });
    // (Near either way: the placements priced without the kernel model are among them.)
    const bool near = c->predicted_s <= (1 + PhaseGains::near_tie) * first_start->predicted_s ||
                      c->effort_s <= (1 + PhaseGains::near_tie) * first_effort;
    if (!repeat && (near || c->searched)) to_price.push_back(c);
  }
  // (The polish paid for pricing its plan; the short search's second run on
  // exact areas is weighed as its first: see short_search.)
  const auto second_runs = static_cast<std::size_t>(std::count_if(
      to_price.begin(), to_price.end(), [](const Candidate* c) { return c->origin.ends_with("+short(area)"); }));
  bool priced = to_price.size() >= 2 &&
                (polished || worth(static_cast<double>(to_price.size() - second_runs) * cost.price_plan, weight,
                                   PhaseGains::price, best_effort().effort_s, effort_bound));
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
  // (Across nodes under a kernel model the gap of the measured gains.)
  const double stages_from = effort_on_areas(to, grid) ? best->effort_s : priced ? step : best->predicted_s;
  const bool may_stage = in.shape().auto_stages() && in.pricing() != nullptr;
  const bool unpriced_pays = worth(cost.stages_unpriced, weight, stages_gain, stages_from, effort_bound);
  const bool priced_pays =
      worth(cost.stages + (priced ? 0.0 : cost.price_plan), weight, stages_gain, stages_from, effort_bound);
  // Under a kernel model static's dispatch on its own grid across nodes is
  // priced at two stages, as its test charges: on the kernels' gaps the test
  // passed where its unpriced two stages were slower (planned layout, used
  // once, P = 16-32: 7-10 of 20 full_document packs, by up to 21 %;
  // docs/bounds.md).
  const bool price_static_stages = prices.kernel && best->grid != in.grid();
  if (may_stage && !one_node && price_static_stages && priced_pays) {
    const auto placement = in.pricing()->add(best->grid, best->rank);
    if (!priced) {
      const PlanPrice one = in.pricing()->price(placement, PlanShape::fixed(1, relay));
      step = one.step, compute_bound = one.compute_bound, ++plans;
      priced = true;
    }
    const PlanPrice two = in.pricing()->price(placement, PlanShape::fixed(2, relay));
    ++plans;
    if (two.step < step) step = two.step, chosen_stages = 2;
  } else if (may_stage && !one_node && (best->grid == in.grid() ? unpriced_pays : priced_pays)) {
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
