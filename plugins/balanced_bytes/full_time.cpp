// The full path's phases: the time mode made ahead, or where it pays for its
// planning time. Searched placements of every start (and of the members that
// dispatch tokens, on their own grids) are priced as plans by the cost model's
// timing model (plan_pricing.hpp); the fastest plan wins, with its stage count
// where the host lets the solver choose (stages 0 = auto). On the input grid
// the solve is then repeated under a tighter cap and on finer grids where that
// pays (effort.hpp).
#include "planner.hpp"
#include "time_mode.hpp"

#include <algorithm>
#include <limits>

#include "cpsched/search/byte_model.hpp"
#include "cpsched/search/members.hpp"
#include "cpsched/search/placements.hpp"

namespace cpsched::search {

namespace {

// plan.stages auto: candidates are priced at 1 stage, the kAutoFinalists
// fastest at kAutoStages, the fastest of all then at each of kStageChoices:
// doubling stages hide more with more of them, up to the per-stage latencies
// and synchronisation. A plan with a small local stage gains most from
// pipelining, so its one-stage rank says little; its step is not unimodal in
// the count (docs/bounds.md#balanced_bytes-constants).
constexpr int kAutoStages = 3;
constexpr std::size_t kAutoFinalists = 6;
constexpr int kStageChoices[] = {1, 2, 3, 4, 5};

// Relay node sizes to price: the host's setting, or (auto) none and, when the
// ranks span several nodes, also the node size.
std::vector<int> relay_options_of(const SolveInput& in) {
  const PlanShape& asked = in.shape();
  std::vector<int> relay_options{asked.auto_relay() ? 0 : asked.relay_node_size()};
  if (const int node = asked.auto_relay() ? auto_relay_node(in) : 0) relay_options.push_back(node);
  return relay_options;
}

// The probe (stages auto): the input grid's starts as they are and the bytes
// objective's result, the PlanPricer::batch of lowest bound priced at
// kAutoStages with `relay`.
void price_probe(PlanPricer& pricer, const std::vector<Candidate>& seen,
                 const std::optional<Candidate>& bytes_candidate, int relay) {
  std::vector<const Candidate*> probe;
  for (const Candidate& c : seen)
    if (!c.searched) probe.push_back(&c);
  if (bytes_candidate) probe.push_back(&*bytes_candidate);
  pricer.add(probe);
  std::vector<PlanPricer::Job> jobs;
  for (std::size_t i : pricer.by_bound())
    if (jobs.size() < PlanPricer::batch) jobs.push_back({i, kAutoStages, relay});
  pricer.price(std::move(jobs));
}

// The same dispatch as an earlier member of `members` (static's two-level
// dispatch on one node is its one-level one).
bool repeats_earlier_member(const std::vector<MemberResult>& members, const MemberResult& m) {
  bool repeat = false;
  for (const MemberResult& e : members) {
    if (&e == &m) break;
    repeat = repeat || (e.assignment.grid->sharding().blocks == m.assignment.grid->sharding().blocks &&
                        e.assignment.grid->sharding().host == m.assignment.grid->sharding().host &&
                        e.assignment.rank == m.assignment.rank);
  }
  return repeat;
}

// Which candidates to price as plans: every start as it is (owner, usp, the
// members: the plan never loses to one of them) and the bytes objective's
// result; of the searched placements, the `priced_plans` best by predicted
// step (the search's model ignores latencies and HBM kernels: the timing
// model judges).
std::vector<const Candidate*> plan_finals(const std::vector<Candidate>& seen,
                                          const std::optional<Candidate>& bytes_candidate, int priced_plans) {
  std::vector<const Candidate*> finals, searched;
  for (const Candidate& c : seen) {
    if (!c.searched) finals.push_back(&c);
    else searched.push_back(&c);
  }
  if (bytes_candidate) finals.push_back(&*bytes_candidate);
  std::stable_sort(searched.begin(), searched.end(),
                   [](const Candidate* x, const Candidate* y) { return x->predicted_s < y->predicted_s; });
  int priced_searched = 0;
  for (const Candidate* c : searched) {
    if (priced_searched == priced_plans) break;
    const bool repeat =
        std::any_of(finals.begin(), finals.end(), [&](const Candidate* f) { return same_placement(*f, *c); });
    if (!repeat) finals.push_back(c), ++priced_searched;
  }
  return finals;
}

// Stages auto, after every final was priced at one stage (`first`): the
// finalists at kAutoStages (more stages change which plan is fastest: a plan
// with a small local stage gains most from pipelining), the fastest at one
// stage without relays, of those priced; then the fastest of all at the other
// counts of kStageChoices.
void price_stage_choices(PlanPricer& pricer, const std::vector<PlanPricer::Job>& first,
                         const std::vector<int>& relay_options) {
  std::vector<const PlanPricer::Job*> at_first;
  for (const PlanPricer::Job& j : first)
    if (j.relay == relay_options.front() && j.step < std::numeric_limits<double>::infinity()) at_first.push_back(&j);
  std::stable_sort(at_first.begin(), at_first.end(),
                   [](const PlanPricer::Job* x, const PlanPricer::Job* y) { return x->step < y->step; });
  std::vector<PlanPricer::Job> more;
  for (std::size_t i = 0; i < at_first.size() && i < kAutoFinalists; ++i)
    for (int relay : relay_options) more.push_back({at_first[i]->final_index, kAutoStages, relay});
  pricer.price(std::move(more));
  std::vector<PlanPricer::Job> counts;
  for (int st : kStageChoices)
    if (st != 1 && st != kAutoStages) counts.push_back({pricer.best().final_index, st, pricer.best().relay});
  pricer.price(std::move(counts));
}

}  // namespace

// The members not solved yet (those the quick path ran are reused).
TimePlanner::Next TimePlanner::full_members() {
  pool_.members = solve_members(in_, opt_, members_, member_names(in_, opt_, Objective::time, member_tile_),
                                std::move(pool_.solved));
  return Next::go_on;
}

TimePlanner::Next TimePlanner::search_input_grid() {
  GridSearch how = grid_search(opt_, Objective::time);
  how.mu = mu_;
  pool_.candidates = search_grid(in_, opt_, how, pool_.members.results);
  return Next::go_on;
}

// The bytes objective's best placement is a candidate too: the search's
// per-rank estimate of time is a model, the plan's timing is the judge (not on
// grids too large for the members). It is searched with the time mode's
// effort (docs/bounds.md#balanced_bytes-constants) and predicted by the same
// model as the others.
TimePlanner::Next TimePlanner::bytes_candidate() {
  const TaskGrid& grid = *in_.grid();
  if (grid.num_tasks() > opt_.member_max_tasks) return Next::go_on;
  const GridSearch how{Objective::bytes, mu_, opt_.effort > 0 ? opt_.effort : kTimeEffort};
  Candidate c = best_candidate(search_grid(in_, opt_, how, pool_.members.results));
  c.origin = "bytes:" + c.origin;
  const ByteModel model(grid, 1.0, 1.0);
  const TimeObjective to = full_search_objective(in_, grid, opt_.spread, opt_.member_max_tasks);
  c.predicted_s = State(model, c.rank, balance_cap(grid, mu_), 0.0, &to).max_rank_time();
  pool_.bytes = std::move(c);
  return Next::go_on;
}

// The pricer, where plans are priced: on grids beyond member_max_tasks (P =
// 1024 causal: 4M tasks) one plan build costs seconds and latencies are a
// rounding error of the step, so the best predicted candidate is taken
// unpriced. Relays: the host's setting, or (auto) each candidate priced
// without and with them across nodes. Where a probed plan comes within
// `settle` of the compute bound (one full or causal sequence: their plans
// balance well), nothing more is searched or priced.
TimePlanner::Next TimePlanner::probe() {
  relay_options_ = relay_options_of(in_);
  if (in_.grid()->num_tasks() <= opt_.member_max_tasks)
    pricer_.emplace(*in_.pricing(), relay_options_, opt_.threads, opt_.settle);
  if (pricer_ && in_.shape().auto_stages() && opt_.settle > 0)
    price_probe(*pricer_, pool_.candidates, pool_.bytes, relay_options_.front());
  settled_early_ = pricer_ && pricer_->settled();
  return Next::go_on;
}

// The members on their own shardings (static), each once: their plans as
// they are, and searched on their grids while those stay small enough to
// search quickly (the search's candidates there carry their predicted step).
TimePlanner::Next TimePlanner::member_grids() {
  if (settled_early_) return Next::go_on;
  const std::vector<MemberResult>& members = pool_.members.results;
  GridSearch how = grid_search(opt_, Objective::time);
  how.mu = mu_;
  how.member_grid = true;
  for (const MemberResult& m : members) {
    if (m.assignment.grid.get() == in_.grid().get()) continue;  // searched above
    if (repeats_earlier_member(members, m)) continue;           // nothing new to search or price
    if (m.assignment.grid->num_tasks() > kMemberGridSearchTasks) {
      pool_.candidates.push_back({m.name, m.assignment.rank, 0, 0.0, m.assignment.grid});
      continue;
    }
    for (Candidate& c : search_grid(in_.with_grid(m.assignment.grid), opt_, how,
                                    {MemberResult{m.name, m.assignment, in_.grid().get()}})) {
      // Only the member's own placement is a start priced as it is; usp
      // and hybrid on its grid compete by prediction with the searched ones.
      if (!c.searched && c.origin != m.name) c.searched = true;
      c.origin = m.name + "-grid:" + c.origin;
      pool_.candidates.push_back(std::move(c));
    }
  }
  return Next::go_on;
}

// Every final at the first stage count, the most promising (lowest bound)
// first, so that the bound rules out more of the rest.
TimePlanner::Next TimePlanner::price_finalists() {
  if (!pricer_ || settled_early_) return Next::go_on;
  pricer_->add(plan_finals(pool_.candidates, pool_.bytes, opt_.priced_plans));
  std::vector<PlanPricer::Job> first;
  for (std::size_t i : pricer_->by_bound())
    for (int relay : relay_options_) first.push_back({i, first_stages_, relay});
  first_jobs_ = pricer_->price(std::move(first));
  return Next::go_on;
}

// Stages: the host's count, or (auto) the finalists at more (as the other
// solvers plan, every candidate was priced at 1: never slower than one of
// them). Unpriced, the best prediction at the first stage count.
TimePlanner::Next TimePlanner::choose_stages_full() {
  if (pricer_ && !settled_early_ && in_.shape().auto_stages())
    price_stage_choices(*pricer_, first_jobs_, relay_options_);
  const Candidate* best = nullptr;
  double step = std::numeric_limits<double>::infinity();
  int stages = first_stages_, relay = relay_options_.front();
  if (!pricer_) {
    best = &pool_.candidates.front();  // (no bytes candidate on such grids)
    for (const Candidate& c : pool_.candidates)
      if (c.predicted_s < best->predicted_s) best = &c;
    step = best->predicted_s;
  } else {
    const PlanPricer::Job& b = pricer_->best();
    best = &pricer_->final_at(b.final_index), step = b.step, stages = b.stages, relay = b.relay;
  }
  Outcome& o = out_;
  o.path = TimePath::full;
  o.best = *best;
  o.step = step;
  o.shape = PlanShape::fixed(in_.shape().auto_stages() ? stages : first_stages_, in_.shape().auto_relay() ? relay : 0);
  o.relay = relay;
  if (pricer_) {
    o.compute_bound = pricer_->compute_bound();
    o.candidates = pricer_->size(), o.plans = pricer_->priced(), o.skipped_by_bound = pricer_->skipped_by_bound();
    o.settled = pricer_->settled();
  }
  o.settled_early = settled_early_;
  o.cap_mu = mu_;
  for (const std::string& m : pool_.members.skipped) o.remarks += "; member " + m + " skipped";
  return Next::go_on;
}

// On the input grid, a priced plan that did not settle near the bound: the
// full solve again under a tighter cap and on finer grids, where each pays.
TimePlanner::Next TimePlanner::repeats() {
  if (!repeat_) return Next::go_on;
  const double first = out_.step;
  if (out_.compute_bound && !out_.settled) {
    try_tighter_cap();
    try_finer_grids();
  }
  if (!tried_.empty())
    out_.repeats = "; the input grid at mu " + num(mu_) + ": " + num(first * 1e3, "%.4f") + " ms" + tried_;
  out_.input_grid_step = first;
  return Next::go_on;
}

// The full solve again on `on` under the cap `mu`, where that pays (effort.hpp:
// (1 / uses) x cost < gain x the gap left); the faster plan is kept. False
// where it did not run.
bool TimePlanner::repeat_solve(double cost, double gain, const std::string& what, const SolveInput& on, double mu) {
  const double best = out_.step;
  if (!worth(cost, in_.uses().planning_weight(), gain, best, *out_.compute_bound)) {
    tried_ += "; " + what + " not searched (" + num(cost * 1e3) + " ms predicted)";
    return false;
  }
  Outcome r = TimePlanner(on, opt_, members_, mu, member_tile_).run_full();
  tried_ += "; " + what + ": " + num(r.step * 1e3, "%.4f") + " ms";
  if (r.step < best) out_ = std::move(r);
  return true;
}

// On one node, where NVLink makes moving work cheap; across nodes a tighter
// cap sends more over the NICs (docs/bounds.md#a-tighter-balance-cap-on-one-node).
void TimePlanner::try_tighter_cap() {
  const TaskGrid& grid = *in_.grid();
  if (grid.cp_size() > in_.time_prices()->nodes.gpus_per_node || mu_ <= kTighterMu) return;
  const double cost =
      predict_phase_costs(grid.num_tasks(), grid.cp_size(), grid.problem().layout == Layout::planned).full;
  repeat_solve(cost, PhaseGains::tighter_cap, "mu " + num(kTighterMu), in_, kTighterMu);
}

// Only in the fixed layout: in the planned one the dispatching members
// already split documents. On one node under the tighter cap, which pays
// there: finer blocks balance the packs with little work, whose long
// document's rows one block per rank keeps together (docs/bounds.md#finer-blocks).
void TimePlanner::try_finer_grids() {
  const TaskGrid& grid = *in_.grid();
  if (grid.problem().layout != Layout::fixed || !is_sequential(grid)) return;
  const bool tight = grid.cp_size() <= in_.time_prices()->nodes.gpus_per_node && mu_ > kTighterMu;
  const int base = grid.problem().grid.blocks_per_rank;
  for (int blocks = 2 * base; blocks <= std::min(4 * base, opt_.max_blocks_per_rank); blocks *= 2) {
    // The grid first: the full solve's predicted cost is in its tasks.
    std::shared_ptr<const TaskGrid> finer = finer_grid(grid, blocks);
    if (finer->num_tasks() > opt_.member_max_tasks) break;  // its plans would not be priced
    const double cost = predict_phase_costs(finer->num_tasks(), grid.cp_size(), false).full;
    const std::string what = std::to_string(blocks) + " blocks per rank" + (tight ? " at mu " + num(kTighterMu) : "");
    const SolveInput on = in_.with_grid(finer);
    if (!repeat_solve(cost, PhaseGains::finer_grid, what, on, tight ? kTighterMu : mu_)) break;
  }
}

}  // namespace cpsched::search
