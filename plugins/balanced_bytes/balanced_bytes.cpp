#include "balanced_bytes.hpp"
#include "time_mode.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <thread>

#include <cpsched/base/error.hpp>

#include "cpsched/base/parallel_for.hpp"
#include "cpsched/search/byte_model.hpp"
#include "cpsched/search/members.hpp"
#include "cpsched/search/placements.hpp"
#include "cpsched/search/search.hpp"
#include "cpsched/search/state.hpp"

namespace cpsched::search {

std::string num(double v, const char* fmt) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

namespace {

[[noreturn]] void bad(const std::string& name, const std::string& value, const std::string& why) {
  throw Error("balanced_bytes: " + name + " = " + value + " " + why);
}

// binary_greedy's balance target as a member on one node (time mode).
constexpr double kMemberMuOneNode = 1.05;

// The bytes and bottleneck objectives' default effort (move evaluations per
// solve up to 256 tasks; the time objective's is kTimeEffort).
constexpr std::int64_t kBytesEffort = 400000;

// Priced evaluations per task of a repair under the coupled step, before the
// per-rank model takes over: the coupled step prices a short repair, the
// per-rank model a long one at a fraction of the cost
// (docs/bounds.md#the-default-solvers-phase-constants).
constexpr std::int64_t kCoupledRepairPerTask = 8;
constexpr std::int64_t kCoupledRepairMax = 32768;

std::vector<std::int64_t> rank_loads(const TaskGrid& g, const std::vector<Rank>& rank) {
  std::vector<std::int64_t> load(static_cast<std::size_t>(g.cp_size()), 0);
  if (g.per_group_cells()) {
    for (TaskId t = 0; t < g.num_tasks(); ++t) load[static_cast<std::size_t>(rank[static_cast<std::size_t>(t)])] += g.load(t);
    return load;
  }
  // Cell by cell: its groups' tasks share its load (4M tasks at P = 1024 causal).
  const auto G = static_cast<std::size_t>(g.num_groups());
  const std::int64_t heads = g.problem().q_heads_per_task();
  const Rank* r = rank.data();
  for (const Cell& c : g.cells()) {
    const std::int64_t l = c.area * heads;
    for (std::size_t i = 0; i < G; ++i) load[static_cast<std::size_t>(*r++)] += l;
  }
  return load;
}

}  // namespace

bool better(const Candidate& a, const Candidate& b) {
  if ((a.excess == 0) != (b.excess == 0)) return a.excess == 0;
  if (a.excess != b.excess) return a.excess < b.excess;
  return a.objective < b.objective - 1e-9 * std::max(1.0, std::abs(b.objective));
}

const Candidate& best_candidate(const std::vector<Candidate>& cands, std::size_t from) {
  std::size_t best = from;
  for (std::size_t i = from; i < cands.size(); ++i)
    if (better(cands[i], cands[best])) best = i;
  return cands[best];
}

bool is_sequential(const TaskGrid& g) {
  const Problem& p = g.problem();
  const Sharding s = Sharding::sequential(p.seqlen(), p.cp_size(), p.grid.blocks_per_rank);
  return s.blocks == g.sharding().blocks && s.host == g.sharding().host;
}

std::shared_ptr<const TaskGrid> finer_grid(const TaskGrid& g, int blocks_per_rank) {
  auto p = std::make_shared<Problem>(g.problem());
  p->grid.blocks_per_rank = blocks_per_rank;
  p->sharding = Sharding::sequential(p->seqlen(), p->cp_size(), blocks_per_rank);
  return std::make_shared<const TaskGrid>(std::move(p));
}

Options parse_options(const Params& p) {
  Options o;
  const std::string obj = p.get_string("objective");
  if (obj == "auto") o.objective = Objective::automatic;
  else if (obj == "time") o.objective = Objective::time;
  else if (obj == "bytes") o.objective = Objective::bytes;
  else if (obj == "bottleneck") o.objective = Objective::bottleneck;
  else bad("objective", "'" + obj + "'", "is not one of: auto, time, bytes, bottleneck");
  o.spread = p.get_real("spread");
  if (!(o.spread >= 0.0)) bad("spread", num(o.spread), "must be >= 0");
  o.members.clear();
  o.members_by_layout = p.get_string("members") == "auto";
  for (std::string rest = o.members_by_layout ? std::string() : p.get_string("members"); !rest.empty();) {
    const auto comma = rest.find_first_of(",;");
    std::string name = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    if (name.empty()) continue;
    if (name.rfind("balanced_bytes", 0) == 0) bad("members", "'" + name + "'", "cannot name the solver itself");
    o.members.push_back(name);
  }
  o.mu = p.get_real("mu");
  o.fwd_weight = p.get_real("fwd_weight");
  o.bwd_weight = p.get_real("bwd_weight");
  o.bottleneck_weight = p.get_real("bottleneck_weight");
  o.effort = p.get_int("effort");
  const std::int64_t threads = p.get_int("threads");
  const std::int64_t blocks = p.get_int("max_blocks_per_rank");
  const std::int64_t degree = p.get_int("usp_max_degree");
  o.member_max_tasks = p.get_int("member_max_tasks");
  o.seed = static_cast<std::uint64_t>(p.get_int("seed"));
  const std::int64_t priced = p.get_int("priced_plans");
  if (priced < 1 || priced > 1000) bad("priced_plans", std::to_string(priced), "must be in [1, 1000]");
  o.priced_plans = static_cast<int>(priced);
  o.settle = p.get_real("settle");
  if (!(o.settle >= 0.0 && o.settle < 1.0)) bad("settle", num(o.settle), "must be in [0, 1)");
  if (!(o.mu >= 1.0)) bad("mu", num(o.mu), "must be >= 1 (balance target: max load <= mu x mean)");
  if (!(o.fwd_weight >= 0.0)) bad("fwd_weight", num(o.fwd_weight), "must be >= 0");
  if (!(o.bwd_weight >= 0.0)) bad("bwd_weight", num(o.bwd_weight), "must be >= 0");
  if (!(o.fwd_weight + o.bwd_weight > 0.0))
    bad("fwd_weight + bwd_weight", num(o.fwd_weight + o.bwd_weight), "must be > 0 (nothing would be priced)");
  if (!(o.bottleneck_weight >= 0.0)) bad("bottleneck_weight", num(o.bottleneck_weight), "must be >= 0");
  if (o.effort < 0) bad("effort", std::to_string(o.effort), "must be >= 0 (move evaluations per start; 0: default)");
  if (threads < 0) bad("threads", std::to_string(threads), "must be >= 0 (0: hardware threads, at most 8)");
  if (blocks < 1 || blocks > 1024) bad("max_blocks_per_rank", std::to_string(blocks), "must be in [1, 1024]");
  if (o.member_max_tasks < 0)
    bad("member_max_tasks", std::to_string(o.member_max_tasks), "must be >= 0");
  if (degree < 1) bad("usp_max_degree", std::to_string(degree), "must be >= 1");
  o.threads = threads > 0 ? static_cast<int>(std::min<std::int64_t>(threads, 256))
                          : static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1U, 8U));
  o.max_blocks_per_rank = static_cast<int>(blocks);
  o.usp_max_degree = static_cast<int>(std::min<std::int64_t>(degree, 1 << 20));
  return o;
}


namespace {

std::int64_t search_budget(std::int64_t effort, TaskId tasks) {
  // Up to 256 tasks the full effort; beyond, effort x 256 / tasks, so that
  // the search costs about the same time at any size (latency).
  const double scale = std::min(1.0, 256.0 / static_cast<double>(std::max<TaskId>(tasks, 1)));
  return static_cast<std::int64_t>(static_cast<double>(effort) * scale);
}

}  // namespace

GridSearch grid_search(const Options& opt, Objective objective) {
  const std::int64_t effort = opt.effort > 0 ? opt.effort : objective == Objective::time ? kTimeEffort : kBytesEffort;
  return {objective, opt.mu, effort};
}

BalancedBytes::BalancedBytes(const Params& p) : opt_(parse_options(p)), members_(std::make_shared<MemberSolvers>()) {}
BalancedBytes::BalancedBytes(Options o) : opt_(std::move(o)), members_(std::make_shared<MemberSolvers>()) {}
BalancedBytes::~BalancedBytes() = default;

std::vector<std::string> member_names(const SolveInput& in, const Options& opt, Objective objective,
                                      std::int64_t member_tile) {
  if (!opt.members_by_layout) return opt.members;
  // On one node, in time mode, binary_greedy balances to a tighter target
  // than the search's cap: there two stages hide most of its bytes and the
  // step follows the busiest rank's compute
  // (docs/bounds.md#binary_greedy-on-one-node).
  std::string greedy = "binary_greedy";
  if (objective == Objective::time && in.time_prices().has_value() &&
      in.grid()->cp_size() <= in.time_prices()->nodes.gpus_per_node)
    greedy += ":mu=" + num(kMemberMuOneNode);
  // static re-lays out the tokens: a member only where the layout is the solver's to plan.
  if (in.grid()->problem().layout == Layout::fixed) return {greedy};
  if (member_tile > 0) {
    // Of the deal cut at tiles and the published deal with its cuts moved
    // there, the one whose busiest rank touches fewer tiles (static's
    // tile_cuts=auto; docs/bounds.md, "Plans priced as the kernels run them").
    const std::string tile = "tile_tokens=" + std::to_string(member_tile) + "+tile_cuts=auto";
    return {greedy, "static:" + tile, "static:node_ranks=-1+node_chunks=8+" + tile};
  }
  return {greedy, "static", "static:node_ranks=-1+node_chunks=8"};
}

std::int64_t max_load(const TaskGrid& g, const std::vector<Rank>& rank) {
  const std::vector<std::int64_t> load = rank_loads(g, rank);
  return load.empty() ? 0 : *std::max_element(load.begin(), load.end());
}

std::int64_t excess_load(const TaskGrid& g, const std::vector<Rank>& rank, std::int64_t cap) {
  std::int64_t excess = 0;
  for (const std::int64_t l : rank_loads(g, rank)) excess += std::max<std::int64_t>(0, l - cap);
  return excess;
}

// Load = area x q heads; FLOPs = load x FLOPs per pair forward (4 D under
// GQA), the head geometry's backward ratio (2.5 under GQA) x that backward.
// Under a kernel model a task's seconds are its args' at the kernels' rates
// (the grid's, computed once per grid and profile: task_kernel_seconds).
TimeObjective time_objective(const TimePrices& tp, const TaskGrid& grid, double spread) {
  TimeObjective to;
  to.nodes = tp.nodes;
  to.byte_s[0] = tp.byte_s[0];
  to.byte_s[1] = tp.byte_s[1];
  const Heads& h = grid.problem().heads;
  to.load_s = h.fwd_flops_per_pair() * (tp.flop_s[0] + h.bwd_flops_ratio() * tp.flop_s[1]);
  if (tp.kernel) to.kernel = task_kernel_seconds(grid, *tp.kernel);
  to.spread = spread;
  return to;
}

int auto_relay_node(const SolveInput& in) {
  const int node = in.shape().node_size >= 2 ? in.shape().node_size : in.time_prices()->nodes.gpus_per_node;
  return node >= 2 && in.grid()->cp_size() > node ? node : 0;
}

TimeObjective full_search_objective(const SolveInput& in, const TaskGrid& grid, double spread, TaskId priced_tasks) {
  TimeObjective to = time_objective(*in.time_prices(), grid, spread);
  const bool across = grid.problem().layout == Layout::fixed && grid.cp_size() > to.nodes.gpus_per_node &&
                      grid.num_tasks() <= priced_tasks;
  to.coupled = across;
  if (!across) return to;
  // Relays as the plans priced may have them: plan.relay on, or auto (priced
  // with and without), on the hardware's nodes (the only ones the search's
  // model of relays knows).
  const PlanShape& s = in.shape();
  const int node = s.node_size >= 2 ? s.node_size : to.nodes.gpus_per_node;
  to.relays = (s.auto_relay() || s.relay == PlanShape::Relay::on) && node == to.nodes.gpus_per_node;
  return to;
}

MembersRun solve_members(const SolveInput& in, const Options& opt, MemberSolvers& members,
                         const std::vector<std::string>& names, SolvedMembers solved) {
  MembersRun out;
  if (in.grid()->num_tasks() > opt.member_max_tasks) return out;
  // The members not solved yet solve in parallel (each its own slot: the same
  // results in the same order for any thread count).
  std::vector<std::string> to_solve;
  for (const std::string& name : names)
    if (!solved.got.contains(name)) to_solve.push_back(name);
  std::vector<std::optional<Solution>> got(to_solve.size());
  std::vector<std::string> why(to_solve.size());
  parallel_for(to_solve.size(), opt.threads, [&](std::size_t i) { got[i] = members.solve(to_solve[i], in, why[i]); });
  for (std::size_t i = 0; i < to_solve.size(); ++i) {
    solved.got[to_solve[i]] = std::move(got[i]);
    solved.why[to_solve[i]] = std::move(why[i]);
  }
  for (const std::string& name : names) {
    std::optional<Solution>& sol = solved.got[name];
    if (sol) out.results.push_back({name, std::move(sol->assignment), in.grid().get()});
    else out.skipped.push_back(name + " (" + solved.why[name] + ")");
  }
  return out;
}

namespace {

// A start of the search: a placement, searched or (a member's on its own
// grid) priced as it is.
struct Start {
  std::string origin;
  std::vector<Rank> rank;
  bool search = true;
};

// A start after its share of the search: the start as it was, and the state
// searched from it (none where it is priced as it is).
struct Searched {
  Candidate raw;
  std::unique_ptr<State> state;
};

// The search of one grid: its model, cap, budget and time prices, shared by
// the jobs of its starts.
class GridSearcher {
 public:
  GridSearcher(const SolveInput& in, const Options& opt, const GridSearch& how)
      : in_(in), grid_(*in.grid()), opt_(opt), how_(how), time_(how.objective == Objective::time),
        bottleneck_(how.objective == Objective::bottleneck),
        // Time mode prices forward and backward bytes in seconds; the
        // bottleneck objective (the seed's) counts both passes too.
        model_(grid_, time_ || bottleneck_ ? 1.0 : opt.fwd_weight, time_ || bottleneck_ ? 1.0 : opt.bwd_weight),
        cap_(balance_cap(grid_, how.mu)), bottleneck_weight_(bottleneck_ ? 1e3 : opt.bottleneck_weight),
        total_(search_budget(how.effort, grid_.num_tasks())) {
    if (time_) to_ = full_search_objective(in, grid_, opt.spread, opt.member_max_tasks);
  }

  std::vector<Candidate> run(const std::vector<MemberResult>& members) const;

 private:
  std::vector<Start> starts(const std::vector<MemberResult>& members) const;
  Searched search_start(Start& s, std::int64_t share, std::uint64_t seed) const;
  std::unique_ptr<State> repair_start(std::unique_ptr<State> st, Budget& budget) const;
  Candidate candidate_of(const State& st, const std::string& origin) const;
  std::optional<Candidate> search_lead(std::vector<Searched>& done, const std::vector<std::size_t>& to_search,
                                       const std::vector<Candidate>& searched) const;

  const SolveInput& in_;
  const TaskGrid& grid_;
  const Options& opt_;
  const GridSearch& how_;
  const bool time_, bottleneck_;
  const ByteModel model_;
  const std::int64_t cap_;
  const double bottleneck_weight_;
  const std::int64_t total_;
  std::optional<TimeObjective> to_;
};

// The placements of the portfolio's members on this grid. On a member's own
// grid (time mode) the member's placement is priced as it is and only usp and
// hybrid are searched: the other searched starts there rarely won and cost
// half the time (docs/bounds.md#balanced_bytes-constants).
std::vector<Start> GridSearcher::starts(const std::vector<MemberResult>& members) const {
  std::vector<Start> starts;
  if (!how_.member_grid) starts.push_back({"owner", owner_placement(grid_)});
  if (grid_.flattened()) starts.push_back({"usp", usp_placement(grid_, opt_.usp_max_degree)});
  // (Like the members, only on grids small enough to price plans: beyond,
  // one more start is one more search of millions of tasks.)
  if (grid_.flattened() && to_ &&
      grid_.num_tasks() <= std::max<TaskId>(opt_.member_max_tasks, kMemberGridSearchTasks))
    starts.push_back(
        {"hybrid", hybrid_placement(grid_, opt_.usp_max_degree, to_->byte_s, to_->nodes.gpus_per_node)});
  for (const MemberResult& m : members)
    if (m.assignment.grid.get() == in_.grid().get()) starts.push_back({m.name, m.assignment.rank, !how_.member_grid});
  return starts;
}

// The repair; under the coupled step only where it is short, a long one goes
// on with the per-rank model, whose evaluations cost a fraction
// (docs/bounds.md#the-default-solvers-phase-constants).
std::unique_ptr<State> GridSearcher::repair_start(std::unique_ptr<State> st, Budget& budget) const {
  if (!to_ || !to_->coupled) {
    repair(*st, budget);
    return st;
  }
  if (repair_priced(*st, budget, std::min(kCoupledRepairMax, kCoupledRepairPerTask * grid_.num_tasks())) ||
      st->excess() <= 0)
    return st;
  TimeObjective per_rank = *to_;
  per_rank.coupled = per_rank.relays = false;
  State pst(model_, st->placement(), cap_, bottleneck_weight_, &per_rank);
  repair(pst, budget);
  return std::make_unique<State>(model_, pst.placement(), cap_, bottleneck_weight_, &*to_);
}

// One start's job: repair, descend, a short iterated search within `share`.
Searched GridSearcher::search_start(Start& s, std::int64_t share, std::uint64_t seed) const {
  if (!s.search) {  // priced as it is: no state, no prediction
    const std::int64_t excess = excess_load(grid_, s.rank, cap_);
    return {{s.origin, std::move(s.rank), excess, 0.0, in_.grid()}, nullptr};
  }
  auto st = std::make_unique<State>(model_, s.rank, cap_, bottleneck_weight_, to_ ? &*to_ : nullptr);
  Searched out{{s.origin, std::move(s.rank), st->excess(), st->objective(), in_.grid()}, nullptr};
  if (time_) out.raw.predicted_s = st->max_rank_time();
  Budget budget{share};
  st = repair_start(std::move(st), budget);
  descend(*st, budget);
  iterate(*st, budget, seed);
  out.state = std::move(st);
  return out;
}

// (Incremental sums: exact for integer weights, else off by rounding only.)
Candidate GridSearcher::candidate_of(const State& st, const std::string& origin) const {
  Candidate c{origin + "+search", st.placement(), st.excess(), st.objective(), in_.grid(), true};
  if (time_) c.predicted_s = st.max_rank_time();
  return c;
}

// The best searched start gets the other half of the effort. Its result is a
// candidate of its own where it scores better (the plans may still rank the
// other way); where it found nothing better it is an equal placement (iterate
// drifts on plateaus) that would only be priced twice.
std::optional<Candidate> GridSearcher::search_lead(std::vector<Searched>& done,
                                                   const std::vector<std::size_t>& to_search,
                                                   const std::vector<Candidate>& searched) const {
  if (searched.empty()) return std::nullopt;
  std::size_t lead = 0;
  for (std::size_t k = 1; k < searched.size(); ++k)
    if (better(searched[k], searched[lead])) lead = k;
  Budget rest{total_ / 2};
  Searched& s = done[to_search[lead]];
  iterate(*s.state, rest, opt_.seed + 1000);
  Candidate c = candidate_of(*s.state, s.raw.origin);
  if (better(c, searched[lead])) return c;
  return std::nullopt;
}

std::vector<Candidate> GridSearcher::run(const std::vector<MemberResult>& members) const {
  std::vector<Start> starts = this->starts(members);
  const std::size_t n = starts.size();
  std::vector<std::size_t> to_search;
  for (std::size_t i = 0; i < n; ++i)
    if (starts[i].search) to_search.push_back(i);
  const std::size_t ns = to_search.size();
  // One job per start; the searched ones share half the effort.
  std::vector<Searched> done(n);
  const std::int64_t share = ns > 0 ? total_ / static_cast<std::int64_t>(2 * ns) : 0;
  parallel_for(n, opt_.threads, [&](std::size_t i) { done[i] = search_start(starts[i], share, opt_.seed + i); });
  std::vector<Candidate> searched(ns);
  for (std::size_t k = 0; k < ns; ++k)
    searched[k] = candidate_of(*done[to_search[k]].state, done[to_search[k]].raw.origin);
  std::optional<Candidate> lead = search_lead(done, to_search, searched);

  std::vector<Candidate> seen;
  seen.reserve(n + ns + 1);
  for (Searched& s : done) seen.push_back(std::move(s.raw));
  done.clear();  // no start's state outlives its use
  for (Candidate& c : searched) seen.push_back(std::move(c));
  if (lead) seen.push_back(std::move(*lead));
  return seen;
}

}  // namespace

std::vector<Candidate> search_grid(const SolveInput& in, const Options& opt, const GridSearch& how,
                                  const std::vector<MemberResult>& members) {
  return GridSearcher(in, opt, how).run(members);
}

namespace {

// The bytes and bottleneck objectives' Solution of `best`; the starts on the
// input grid (as they were) and the members skipped are noted.
Solution bytes_solution(Candidate best, const std::vector<Candidate>& on_input, const std::vector<std::string>& skipped,
                        Objective objective, double mu) {
  Solution sol;
  Assignment& a = sol.assignment;
  a.grid = best.grid;
  a.rank = std::move(best.rank);
  sol.feasible = best.excess == 0;
  sol.figures.set("objective", best.objective);
  sol.figures.set("blocks_per_rank", a.grid->problem().grid.blocks_per_rank);
  sol.note = "balanced_bytes (" + std::string(objective == Objective::bottleneck ? "bottleneck" : "bytes") +
             "): " + best.origin + " on " + std::to_string(a.grid->problem().grid.blocks_per_rank) +
             " block(s) per rank, objective " + num(best.objective, "%.6e");
  for (const Candidate& c : on_input)
    if (!c.searched) sol.note += "; " + c.origin + " " + num(c.objective, "%.6e") + (c.excess > 0 ? " (above cap)" : "");
  for (const std::string& m : skipped) sol.note += "; member " + m + " skipped";
  if (!sol.feasible) sol.note += "; no placement met mu = " + num(mu) + ", returned the least overloaded";
  return sol;
}

}  // namespace

Solution BalancedBytes::solve(const SolveInput& in) {
  if (!in.grid()) throw Error("balanced_bytes: no task grid given");
  const bool prices_time = in.time_prices().has_value() && in.pricing() != nullptr;
  if (opt_.objective == Objective::time && !prices_time)
    throw Error("balanced_bytes: objective = time needs a cost model that prices time (cost_model: {name: time}); "
                "the configured one does not");
  Objective objective = opt_.objective;
  if (objective == Objective::automatic) objective = prices_time ? Objective::time : Objective::bytes;
  return objective == Objective::time ? solve_time(in) : solve_bytes(in, objective);
}

Solution BalancedBytes::solve_bytes(const SolveInput& in, Objective objective) const {
  const GridSearch how = grid_search(opt_, objective);
  const MembersRun members = solve_members(in, opt_, *members_, member_names(in, opt_, objective, 0), {});
  const std::vector<Candidate> on_input = search_grid(in, opt_, how, members.results);
  Candidate best = best_candidate(on_input);

  // No placement met the cap (a cell alone, or a few big ones, break the
  // balance): cut every shard into more blocks and search again.
  int blocks = in.grid()->problem().grid.blocks_per_rank;
  std::shared_ptr<const TaskGrid> grid = in.grid();
  while (best.excess > 0 && is_sequential(*grid) && blocks * 2 <= opt_.max_blocks_per_rank) {
    blocks *= 2;
    grid = finer_grid(*grid, blocks);
    const std::vector<Candidate> finer = search_grid(in.with_grid(grid), opt_, how, {});
    if (const Candidate& c = best_candidate(finer); better(c, best)) best = c;
  }
  return bytes_solution(std::move(best), on_input, members.skipped, objective, opt_.mu);
}

}  // namespace cpsched::search
