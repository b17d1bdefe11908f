#include "balanced_bytes.hpp"
#include "effort.hpp"
#include "kernel_pick.hpp"
#include "plan_pricing.hpp"
#include "time_mode.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>
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

namespace {

std::string num(double v, const char* fmt = "%.6g") {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

[[noreturn]] void bad(const std::string& name, const std::string& value, const std::string& why) {
  throw Error("balanced_bytes: " + name + " = " + value + " " + why);
}

// Searching a member's own grid (static's dispatch is 8 x finer) costs about
// its task count; beyond this only the member's plan as it is is priced.
constexpr TaskId kMemberGridSearchTasks = 400000;
// The time mode's second full solve on one node: the balance cap it searches
// under (docs/bounds.md#a-tighter-balance-cap-on-one-node: 1.05 and 1.02 gave
// within 0.004 of it; all three together 0.006 more for three solves).
constexpr double kTighterMu = 1.03;
// binary_greedy's balance target as a member on one node (time mode).
constexpr double kMemberMuOneNode = 1.05;

// The time objective's default effort (move evaluations per solve up to 256 tasks).
constexpr std::int64_t kTimeEffort = 10000;

// Priced evaluations per task of a repair under the coupled step, before the
// per-rank model takes over.
constexpr std::int64_t kCoupledRepairPerTask = 8;
constexpr std::int64_t kCoupledRepairMax = 32768;

// plan.stages auto: candidates are priced at 1 stage, the kAutoFinalists
// fastest at kAutoStages, the fastest of all then at each of kStageChoices:
// doubling stages hide more with more of them, up to the per-stage latencies
// and synchronisation. A plan with a small local stage gains most from
// pipelining, so its one-stage rank says little (how these numbers were
// chosen: docs/bounds.md#balanced_bytes-constants).
constexpr int kAutoStages = 3;
constexpr std::size_t kAutoFinalists = 6;
constexpr int kStageChoices[] = {1, 2, 3, 4, 5};

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

// a strictly better than b: meeting the cap first, then less load above it,
// then a lower objective.
bool better(const Candidate& a, const Candidate& b) {
  if ((a.excess == 0) != (b.excess == 0)) return a.excess == 0;
  if (a.excess != b.excess) return a.excess < b.excess;
  return a.objective < b.objective - 1e-9 * std::max(1.0, std::abs(b.objective));
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

}  // namespace

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

std::int64_t search_budget(const Options& o, TaskId tasks) {
  const std::int64_t effort = o.effort > 0 ? o.effort : o.objective == Objective::time ? kTimeEffort : 400000;
  // Up to 256 tasks the full effort; beyond, effort x 256 / tasks, so that
  // the search costs about the same time at any size (latency).
  const double scale = std::min(1.0, 256.0 / static_cast<double>(std::max<TaskId>(tasks, 1)));
  return static_cast<std::int64_t>(static_cast<double>(effort) * scale);
}

BalancedBytes::BalancedBytes(const Params& p) : opt_(parse_options(p)), members_(std::make_shared<MemberSolvers>()) {}
BalancedBytes::BalancedBytes(Options o) : opt_(std::move(o)), members_(std::make_shared<MemberSolvers>()) {}
BalancedBytes::~BalancedBytes() = default;

std::vector<std::string> BalancedBytes::member_names(const SolveInput& in) const {
  if (!opt_.members_by_layout) return opt_.members;
  // On one node, in time mode, binary_greedy balances to a tighter target
  // than the search's cap: there two stages hide most of its bytes and the
  // step follows the busiest rank's compute
  // (docs/bounds.md#binary_greedy-on-one-node).
  std::string greedy = "binary_greedy";
  if (opt_.objective == Objective::time && in.time_prices().has_value() &&
      in.grid()->cp_size() <= in.time_prices()->nodes.gpus_per_node)
    greedy += ":mu=" + num(kMemberMuOneNode);
  // static re-lays out the tokens: a member only where the layout is the solver's to plan.
  if (in.grid()->problem().layout == Layout::fixed) return {greedy};
  if (opt_.member_tile > 0) {
    const std::string tile = "tile_tokens=" + std::to_string(opt_.member_tile);
    return {greedy, "static:" + tile, "static:node_ranks=-1+node_chunks=8+" + tile};
  }
  return {greedy, "static", "static:node_ranks=-1+node_chunks=8"};
}

BalancedBytes BalancedBytes::with_objective(Objective o) const {
  BalancedBytes b(*this);
  b.opt_.objective = o;
  return b;  // shares the loaded member solvers
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

// The tokens every tile side of both passes divides (static's tile_tokens), 0 without a kernel model.
static Token kernel_tile_tokens(const HardwareProfile& hw) {
  if (!hw.kernel) return 0;
  const KernelModel& k = *hw.kernel;
  Token tile = 1;
  for (const int t : {k.fwd.tile_q, k.fwd.tile_k, k.bwd.tile_q, k.bwd.tile_k})
    if (t > 0) tile = std::lcm(tile, Token{t});
  return tile > 1 ? tile : 0;
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

std::vector<MemberResult> BalancedBytes::solve_members(const SolveInput& in, std::vector<std::string>& skipped,
                                                       SolvedMembers solved) const {
  std::vector<MemberResult> out;
  if (in.grid()->num_tasks() > opt_.member_max_tasks) return out;
  // The members not solved yet solve in parallel (each its own slot: the same
  // results in the same order for any thread count).
  const std::vector<std::string> names = member_names(in);
  std::vector<std::string> to_solve;
  for (const std::string& name : names)
    if (!solved.got.contains(name)) to_solve.push_back(name);
  std::vector<std::optional<Solution>> got(to_solve.size());
  std::vector<std::string> why(to_solve.size());
  parallel_for(to_solve.size(), opt_.threads, [&](std::size_t i) { got[i] = members_->solve(to_solve[i], in, why[i]); });
  for (std::size_t i = 0; i < to_solve.size(); ++i) {
    solved.got[to_solve[i]] = std::move(got[i]);
    solved.why[to_solve[i]] = std::move(why[i]);
  }
  for (const std::string& name : names) {
    std::optional<Solution>& sol = solved.got[name];
    if (sol) out.push_back({name, std::move(sol->assignment), in.grid().get()});
    else skipped.push_back(name + " (" + solved.why[name] + ")");
  }
  return out;
}

Candidate BalancedBytes::solve_grid(const SolveInput& in, std::vector<Candidate>& seen,
                                    const std::vector<MemberResult>& members, bool member_grid) const {
  const TaskGrid& grid = *in.grid();
  const bool time = opt_.objective == Objective::time;
  const bool bottleneck = opt_.objective == Objective::bottleneck;
  // Time mode prices forward and backward bytes in seconds; the bottleneck
  // objective (the seed's) counts both passes too.
  const double fw = time || bottleneck ? 1.0 : opt_.fwd_weight;
  const double bwv = time || bottleneck ? 1.0 : opt_.bwd_weight;
  const ByteModel model(grid, fw, bwv);
  const std::int64_t cap = balance_cap(grid, opt_.mu);
  const double bottleneck_weight = bottleneck ? 1e3 : opt_.bottleneck_weight;
  const std::int64_t total = search_budget(opt_, grid.num_tasks());
  std::optional<TimeObjective> to;
  if (time) to = full_search_objective(in, grid, opt_.spread, opt_.member_max_tasks);

  // The starts: placements of the portfolio's members on this grid. On a
  // member's own grid (time mode) the member's placement is priced as it is
  // and only usp and hybrid are searched: the other searched starts there
  // rarely won and cost half the time (docs/bounds.md#balanced_bytes-constants).
  struct Start {
    std::string origin;
    std::vector<Rank> rank;
    bool search = true;
  };
  std::vector<Start> starts;
  if (!member_grid) starts.push_back({"owner", owner_placement(grid)});
  if (grid.flattened()) starts.push_back({"usp", usp_placement(grid, opt_.usp_max_degree)});
  // (Like the members, only on grids small enough to price plans: beyond,
  // one more start is one more search of millions of tasks.)
  if (grid.flattened() && to && grid.num_tasks() <= std::max<TaskId>(opt_.member_max_tasks, kMemberGridSearchTasks))
    starts.push_back({"hybrid", hybrid_placement(grid, opt_.usp_max_degree, to->byte_s, to->nodes.gpus_per_node)});
  for (const MemberResult& m : members)
    if (m.assignment.grid.get() == in.grid().get()) starts.push_back({m.name, m.assignment.rank, !member_grid});

  // Phase 1, one job per searched start: repair, descend, a short iterated
  // search.
  const std::size_t n = starts.size();
  std::vector<std::size_t> to_search;
  for (std::size_t i = 0; i < n; ++i)
    if (starts[i].search) to_search.push_back(i);
  const std::size_t ns = to_search.size();
  std::vector<Candidate> raw(n);
  std::vector<std::unique_ptr<State>> states(n);
  parallel_for(n, opt_.threads, [&](std::size_t i) {
    if (!starts[i].search) {
      // Priced as it is: no state, no prediction.
      const std::int64_t excess = excess_load(grid, starts[i].rank, cap);
      raw[i] = {starts[i].origin, std::move(starts[i].rank), excess, 0.0, in.grid()};
      return;
    }
    auto st = std::make_unique<State>(model, starts[i].rank, cap, bottleneck_weight, to ? &*to : nullptr);
    raw[i] = {starts[i].origin, std::move(starts[i].rank), st->excess(), st->objective(), in.grid()};
    if (time) raw[i].predicted_s = st->max_rank_time();
    Budget budget{total / static_cast<std::int64_t>(2 * ns)};
    if (to && to->coupled) {
      // The coupled step prices the repair where it is short (document masks:
      // 1-3 evaluations per task at P = 64); a long one (one causal sequence
      // from its owners: up to 40 per task) goes on with the per-rank model,
      // whose evaluations cost a fraction (docs/bounds.md#the-fixed-layout).
      if (!repair_priced(*st, budget, std::min(kCoupledRepairMax, kCoupledRepairPerTask * grid.num_tasks())) &&
          st->excess() > 0) {
        TimeObjective per_rank = *to;
        per_rank.coupled = per_rank.relays = false;
        State pst(model, st->placement(), cap, bottleneck_weight, &per_rank);
        repair(pst, budget);
        st = std::make_unique<State>(model, pst.placement(), cap, bottleneck_weight, &*to);
      }
    } else {
      repair(*st, budget);
    }
    descend(*st, budget);
    iterate(*st, budget, opt_.seed + i);
    states[i] = std::move(st);
  });
  // (Incremental sums: exact for integer weights, else off by rounding only.)
  auto searched_of = [&](std::size_t i) {
    Candidate c{raw[i].origin + "+search", states[i]->placement(), states[i]->excess(), states[i]->objective(),
                in.grid(), true};
    if (time) c.predicted_s = states[i]->max_rank_time();
    return c;
  };
  std::vector<Candidate> searched(ns);
  for (std::size_t k = 0; k < ns; ++k) searched[k] = searched_of(to_search[k]);

  // Phase 2: the best searched start gets the other half of the effort. Its
  // result is a candidate of its own where it scores better (the plans may
  // still rank the other way); where it found nothing better it is an equal
  // placement (iterate drifts on plateaus) that would only be priced twice.
  std::optional<Candidate> final_cand;
  if (ns > 0) {
    std::size_t lead = 0;
    for (std::size_t k = 1; k < ns; ++k)
      if (better(searched[k], searched[lead])) lead = k;
    Budget rest{total / 2};
    iterate(*states[to_search[lead]], rest, opt_.seed + 1000);
    Candidate c = searched_of(to_search[lead]);
    if (better(c, searched[lead])) final_cand = std::move(c);
  }
  states.clear();  // no start's state outlives its use

  const std::size_t first = seen.size();
  for (auto& c : raw) seen.push_back(std::move(c));
  for (auto& c : searched) seen.push_back(std::move(c));
  if (final_cand) seen.push_back(std::move(*final_cand));
  std::size_t best = first;
  for (std::size_t i = first; i < seen.size(); ++i)
    if (better(seen[i], seen[best])) best = i;
  return seen[best];
}

Solution BalancedBytes::solve(const SolveInput& in) {
  if (!in.grid()) throw Error("balanced_bytes: no task grid given");
  const bool prices_time = in.time_prices().has_value() && in.pricing() != nullptr;
  if (opt_.objective == Objective::time && !prices_time)
    throw Error("balanced_bytes: objective = time needs a cost model that prices time (cost_model: {name: time}); "
                "the configured one does not");
  if (opt_.objective == Objective::automatic)
    return with_objective(prices_time ? Objective::time : Objective::bytes).solve(in);
  return opt_.objective == Objective::time ? solve_time(in) : solve_bytes(in);
}

Solution BalancedBytes::solve_bytes(const SolveInput& in) const {
  std::vector<Candidate> seen;
  std::vector<std::string> skipped;
  Candidate best = solve_grid(in, seen, solve_members(in, skipped));
  const std::size_t on_input_grid = seen.size();

  // No placement met the cap (a cell alone, or a few big ones, break the
  // balance): cut every shard into more blocks and search again.
  int blocks = in.grid()->problem().grid.blocks_per_rank;
  std::shared_ptr<const TaskGrid> grid = in.grid();
  while (best.excess > 0 && is_sequential(*grid) && blocks * 2 <= opt_.max_blocks_per_rank) {
    blocks *= 2;
    grid = finer_grid(*grid, blocks);
    Candidate c = solve_grid(in.with_grid(grid), seen, {});
    if (better(c, best)) best = std::move(c);
  }

  Solution sol;
  Assignment& a = sol.assignment;
  a.grid = best.grid;
  a.rank = std::move(best.rank);
  sol.feasible = best.excess == 0;
  sol.figures.set("objective", best.objective);
  sol.figures.set("blocks_per_rank", a.grid->problem().grid.blocks_per_rank);
  sol.note = "balanced_bytes (" + std::string(opt_.objective == Objective::bottleneck ? "bottleneck" : "bytes") +
           "): " + best.origin + " on " + std::to_string(a.grid->problem().grid.blocks_per_rank) +
           " block(s) per rank, objective " + num(best.objective, "%.6e");
  for (std::size_t i = 0; i < on_input_grid; ++i)
    if (!seen[i].searched)
      sol.note += "; " + seen[i].origin + " " + num(seen[i].objective, "%.6e") +
                  (seen[i].excess > 0 ? " (above cap)" : "");
  for (const std::string& m : skipped) sol.note += "; member " + m + " skipped";
  if (!sol.feasible) sol.note += "; no placement met mu = " + num(opt_.mu) + ", returned the least overloaded";
  return sol;
}

namespace {

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

// Prices the finals as plans: every final at the first stage count, the most
// promising (lowest bound) first, so that the bound rules out more of the rest.
void price_finals(PlanPricer& pricer, const std::vector<const Candidate*>& finals, int first_stages,
                  bool auto_stages, const std::vector<int>& relay_options) {
  pricer.add(finals);
  const std::vector<std::size_t> order = pricer.by_bound();
  std::vector<PlanPricer::Job> first;
  for (std::size_t i : order)
    for (int relay : relay_options) first.push_back({i, first_stages, relay});
  first = pricer.price(std::move(first));
  if (auto_stages) price_stage_choices(pricer, first, relay_options);
}

// The plan the time mode chose: its step (priced, or predicted where no plan
// was priced), stage count and relay node size.
struct TimeChoice {
  const Candidate* best = nullptr;
  double step = std::numeric_limits<double>::infinity();
  int stages = 1;
  int relay = 0;
};

// The time mode's Solution of `c`: the shape where the host left it open
// (stages auto, relays auto), its figures and how it was found. pricer: null
// where no plan was priced.
Solution time_solution(const TimeChoice& c, const Options& opt, const PlanShape& asked, bool auto_stages,
                       int first_stages, const PlanPricer* pricer, bool settled_early,
                       const std::vector<std::string>& skipped) {
  // mu caps the search; plans are judged by their step time alone (a rank
  // above the cap is priced in it), and the result says whether it meets mu.
  const bool best_ok = balance_cap(*c.best->grid, opt.mu) >= max_load(*c.best->grid, c.best->rank);
  Solution sol;
  Assignment& a = sol.assignment;
  a.grid = c.best->grid;
  a.rank = c.best->rank;
  sol.feasible = best_ok;
  sol.shape = PlanShape::fixed(auto_stages ? c.stages : first_stages, asked.auto_relay() ? c.relay : 0);
  const int stages = sol.shape.stages;
  sol.figures.set("predicted_step_s", c.step);
  if (pricer) {
    sol.figures.set("compute_bound_s", pricer->compute_bound());
    sol.figures.set("candidates", static_cast<double>(pricer->size()));
    sol.figures.set("plans_priced", static_cast<double>(pricer->priced()));
    sol.figures.set("plans_skipped_by_bound", static_cast<double>(pricer->skipped_by_bound()));
  }
  sol.figures.set("stages", stages);
  sol.figures.set("full_search", 1);
  sol.figures.set("settled", pricer != nullptr && pricer->settled() ? 1 : 0);
  sol.figures.set("relay_node_size", c.relay);
  sol.figures.set("blocks_per_rank", a.grid->problem().grid.blocks_per_rank);
  sol.note = "balanced_bytes (time): " + c.best->origin + " on " +
             std::to_string(a.grid->problem().grid.blocks_per_rank) + " block(s) per rank, " +
             std::to_string(stages) + " stage(s)" +
             (c.relay > 0 ? ", relays on nodes of " + std::to_string(c.relay) : std::string()) +
             ", predicted step " + num(c.step * 1e3, "%.4f") + " ms ";
  if (!pricer)
    sol.note += "by the search's model (grid above member_max_tasks: no plan priced)";
  else
    sol.note += "of " + std::to_string(pricer->size()) + " candidates (" + std::to_string(pricer->priced()) +
                " plans priced, " + std::to_string(pricer->skipped_by_bound()) + " skipped by their step bound" +
                (pricer->settled() ? "; within " + num(100 * opt.settle) + " % of the compute bound" : "") +
                (settled_early ? ", so no member grid was searched" : "") + ")";
  for (const std::string& m : skipped) sol.note += "; member " + m + " skipped";
  if (!best_ok) sol.note += "; the fastest plan is above mu = " + num(opt.mu);
  return sol;
}

}  // namespace

// The bytes objective's best placement, searched with the time mode's effort
// (the bytes mode's own 40x larger effort changed no step:
// docs/bounds.md#balanced_bytes-constants), with its predicted step.
Candidate BalancedBytes::bytes_mode_candidate(const SolveInput& in, const std::vector<MemberResult>& members) const {
  BalancedBytes bytes_mode = with_objective(Objective::bytes);
  bytes_mode.opt_.effort = opt_.effort > 0 ? opt_.effort : kTimeEffort;
  std::vector<Candidate> own;
  Candidate c = bytes_mode.solve_grid(in, own, members);
  c.origin = "bytes:" + c.origin;
  // Its predicted step, by the same model as the others.
  const ByteModel model(*in.grid(), 1.0, 1.0);
  const TimeObjective to = full_search_objective(in, *in.grid(), opt_.spread, opt_.member_max_tasks);
  c.predicted_s = State(model, c.rank, balance_cap(*in.grid(), opt_.mu), 0.0, &to).max_rank_time();
  return c;
}

// The members on their own shardings (static), each once: their plans as
// they are, and searched on their grids while those stay small enough to
// search quickly (the search's candidates there carry their predicted step).
void BalancedBytes::search_member_grids(const SolveInput& in, const std::vector<MemberResult>& members,
                                        std::vector<Candidate>& seen) const {
  for (const MemberResult& m : members) {
    if (m.assignment.grid.get() == in.grid().get()) continue;  // searched above
    if (repeats_earlier_member(members, m)) continue;          // nothing new to search or price
    if (m.assignment.grid->num_tasks() > kMemberGridSearchTasks) {
      seen.push_back({m.name, m.assignment.rank, 0, 0.0, m.assignment.grid});
      continue;
    }
    std::vector<Candidate> own;
    solve_grid(in.with_grid(m.assignment.grid), own, {MemberResult{m.name, m.assignment, in.grid().get()}},
               /*member_grid=*/true);
    for (Candidate& c : own) {
      // Only the member's own placement is a start priced as it is; usp
      // and hybrid on its grid compete by prediction with the searched ones.
      if (!c.searched && c.origin != m.name) c.searched = true;
      c.origin = m.name + "-grid:" + c.origin;
      seen.push_back(std::move(c));
    }
  }
}

// Time mode: searched placements of every start (and of the members that
// dispatch tokens, on their own grids) are priced as plans by the cost model's
// timing model (plan_pricing.hpp); the fastest plan wins, with its stage count
// when the host lets the solver choose (stages 0 = auto).
Solution BalancedBytes::solve_time(const SolveInput& in) const {
  if (!in.time_prices()->kernel) return solve_time_on(in);
  // Under a kernel model: today's plan, every decision on the profile without
  // its table (kernel_pick.hpp). Used a few times, at today's cost: the
  // search on the kernels' seconds and a second search beside it had made the
  // used-once path 1.2-2.8x slower and its plans slower than today's on up
  // to 7 of 20 packs; pricing today's plans under the kernel model too cost
  // 13 % more and changed no plan (docs/bounds.md). Made ahead, the fastest
  // under the kernel model of the plans it priced, and of the search on the
  // kernels' seconds.
  const bool ahead = in.uses().planning_weight() <= 0;
  AreasFirstPricing areas(*in.pricing(), ahead);
  TimePrices flat = *in.time_prices();
  flat.kernel.reset();
  SolveInput on_areas(in);
  on_areas.with_time_prices(flat).with_pricing(&areas);
  if (!ahead) {
    // On one node, static's dispatch cut at the kernels' tiles, at the cost of
    // its published cuts, compared with the others on exact areas as today's
    // (no plan of 40 packs at P = 8 slower than today's under the kernel
    // model). Pricing it beside today's plan took 2.3x today's instructions
    // at P = 8; across nodes, cut at the tiles without pricing, the plans were
    // slower on up to 6 of 20 packs (docs/bounds.md).
    BalancedBytes tiled(*this);
    if (in.grid()->cp_size() <= in.time_prices()->nodes.gpus_per_node)
      tiled.opt_.member_tile = kernel_tile_tokens(*in.time_prices()->kernel);
    Solution sol = tiled.solve_time_on(on_areas);
    sol.note += "; decided on exact areas (the profile's kernel model prices the plan built)";
    return sol;
  }
  Solution sol = solve_time_on(on_areas);
  const std::optional<AreasFirstPricing::Priced> pick = areas.fastest_on_kernels(sol, in.shape());
  if (!pick) return sol;
  sol = with_kernel_pick(std::move(sol), *pick, opt_.mu);
  // Made ahead (the time is hidden): the search on the kernels' seconds too,
  // and the faster of the two plans under the kernel model.
  Solution k = solve_time_on(in);
  const std::optional<double> ks = k.figures.get("predicted_step_s");
  if (k.figures.has("compute_bound_s") && ks && *ks < pick->prices.kernels.step) {
    k.note += "; faster than the plan searched on exact areas (" + num(pick->prices.kernels.step * 1e3, "%.4f") +
              " ms under the kernel model)";
    return k;
  }
  sol.note += "; the search on the kernels' seconds found no faster plan (" +
              (ks ? num(*ks * 1e3, "%.4f") + " ms" : std::string("none priced")) + ")";
  return sol;
}

Solution BalancedBytes::solve_time_on(const SolveInput& in) const {
  SolvedMembers solved;
  if (std::optional<Solution> quick = solve_time_quick(in, solved)) return std::move(*quick);
  Solution sol = solve_time_full(in, std::move(solved));
  const std::optional<double> first = sol.figures.get("predicted_step_s");
  if (!first) return sol;
  // Only a priced plan that did not settle near the bound is worth a repetition.
  if (sol.figures.has("compute_bound_s") && sol.figures.get("settled").value_or(0) == 0) {
    std::string tried;
    try_tighter_cap(in, sol, tried);
    try_finer_grids(in, sol, tried);
    if (!tried.empty())
      sol.note += "; the input grid at mu " + num(opt_.mu) + ": " + num(*first * 1e3, "%.4f") + " ms" + tried;
  }
  // The full solve's own plan, before the repetitions (a plan is kept only where it is faster).
  sol.figures.set("input_grid_step_s", *first);
  return sol;
}

bool BalancedBytes::repeat_solve(const SolveInput& in, Solution& sol, double cost, double gain,
                                 const std::string& what, std::string& tried,
                                 const std::function<Solution()>& solve) const {
  const double best = *sol.figures.get("predicted_step_s");
  if (!worth(cost, in.uses().planning_weight(), gain, best, *sol.figures.get("compute_bound_s"))) {
    tried += "; " + what + " not searched (" + num(cost * 1e3) + " ms predicted)";
    return false;
  }
  Solution r = solve();
  const double step = r.figures.get("predicted_step_s").value_or(std::numeric_limits<double>::infinity());
  tried += "; " + what + ": " + num(step * 1e3, "%.4f") + " ms";
  if (step < best) sol = std::move(r);
  return true;
}

void BalancedBytes::try_tighter_cap(const SolveInput& in, Solution& sol, std::string& tried) const {
  const TaskGrid& grid = *in.grid();
  // On one node, where NVLink makes moving work cheap; across nodes a tighter
  // cap sends more over the NICs (docs/bounds.md#a-tighter-balance-cap-on-one-node).
  if (grid.cp_size() > in.time_prices()->nodes.gpus_per_node || opt_.mu <= kTighterMu) return;
  const double cost = predict_phase_costs(grid.num_tasks(), grid.cp_size(), grid.problem().layout == Layout::planned).full;
  repeat_solve(in, sol, cost, PhaseGains::tighter_cap, "mu " + num(kTighterMu), tried,
               [&] { return solve_time_tight(in); });
}

Solution BalancedBytes::solve_time_tight(const SolveInput& in) const {
  BalancedBytes tight = *this;
  tight.opt_.mu = kTighterMu;
  Solution t = tight.solve_time_full(in, {});
  // Feasible against the caller's mu, which the tighter cap implies.
  t.feasible = balance_cap(*t.assignment.grid, opt_.mu) >= max_load(*t.assignment.grid, t.assignment.rank);
  return t;
}

void BalancedBytes::try_finer_grids(const SolveInput& in, Solution& sol, std::string& tried) const {
  const TaskGrid& grid = *in.grid();
  // Only in the fixed layout: in the planned one the dispatching members
  // already split documents (finer sequential grids changed no plan there).
  // On one node under the tighter cap, which pays there (try_tighter_cap):
  // finer blocks balance the packs with little work, whose long document's
  // rows one block per rank keeps together (docs/bounds.md#finer-blocks).
  if (grid.problem().layout != Layout::fixed || !is_sequential(grid)) return;
  const bool tight = grid.cp_size() <= in.time_prices()->nodes.gpus_per_node && opt_.mu > kTighterMu;
  const int base = grid.problem().grid.blocks_per_rank;
  for (int blocks = 2 * base; blocks <= std::min(4 * base, opt_.max_blocks_per_rank); blocks *= 2) {
    // The grid first: the full solve's predicted cost is in its tasks.
    std::shared_ptr<const TaskGrid> finer = finer_grid(grid, blocks);
    if (finer->num_tasks() > opt_.member_max_tasks) break;  // its plans would not be priced
    const double cost = predict_phase_costs(finer->num_tasks(), grid.cp_size(), false).full;
    const std::string what = std::to_string(blocks) + " blocks per rank" + (tight ? " at mu " + num(kTighterMu) : "");
    if (!repeat_solve(in, sol, cost, PhaseGains::finer_grid, what, tried, [&] {
          return tight ? solve_time_tight(in.with_grid(finer)) : solve_time_full(in.with_grid(finer), {});
        }))
      break;
  }
}

Solution BalancedBytes::solve_time_full(const SolveInput& in, SolvedMembers solved) const {
  std::vector<Candidate> seen;
  std::vector<std::string> skipped;
  const std::vector<MemberResult> members = solve_members(in, skipped, std::move(solved));
  solve_grid(in, seen, members);
  // The bytes objective's best placement is a candidate too: the search's
  // per-rank estimate of time is a model, the plan's timing is the judge.
  // (Not on grids too large for the members.)
  std::optional<Candidate> bytes_candidate;
  if (in.grid()->num_tasks() <= opt_.member_max_tasks) bytes_candidate = bytes_mode_candidate(in, members);

  // Stages: the host's count, or (auto) every candidate at 1 stage (as the
  // other solvers plan: never slower than one of them), the kAutoFinalists
  // fastest also at kAutoStages, and the winner at every count of
  // kStageChoices (its step is not unimodal in the count: walking from 3
  // stages while the step fell missed a faster 2 on the step-time benchmark).
  const bool auto_stages = in.shape().auto_stages();
  const int first_stages = auto_stages ? 1 : in.shape().stages;
  // Relays: the host's setting, or (auto) each candidate priced without and
  // with them when the ranks span several nodes.
  const std::vector<int> relay_options = relay_options_of(in);
  // On grids beyond member_max_tasks (P = 1024 causal: 4M tasks) one plan
  // build costs seconds and latencies are a rounding error of the step: the
  // best predicted candidate is taken without pricing it.
  const bool unpriced = in.grid()->num_tasks() > opt_.member_max_tasks;
  std::optional<PlanPricer> pricer;
  if (!unpriced) pricer.emplace(*in.pricing(), relay_options, opt_.threads, opt_.settle);

  // Where a probed plan comes within `settle` of the compute bound (one full
  // or causal sequence: their plans balance well), nothing more is searched or
  // priced.
  if (pricer && auto_stages && opt_.settle > 0) price_probe(*pricer, seen, bytes_candidate, relay_options.front());
  const bool settled_early = pricer && pricer->settled();
  if (!settled_early) search_member_grids(in, members, seen);

  TimeChoice choice{nullptr, std::numeric_limits<double>::infinity(), first_stages, relay_options.front()};
  if (unpriced) {
    choice.best = &seen.front();  // (no bytes candidate on such grids)
    for (const Candidate& c : seen)
      if (c.predicted_s < choice.best->predicted_s) choice.best = &c;
    choice.step = choice.best->predicted_s;
  } else {
    if (!settled_early)
      price_finals(*pricer, plan_finals(seen, bytes_candidate, opt_.priced_plans), first_stages, auto_stages,
                   relay_options);
    const PlanPricer::Job& b = pricer->best();
    choice = {&pricer->final_at(b.final_index), b.step, b.stages, b.relay};
  }
  return time_solution(choice, opt_, in.shape(), auto_stages, first_stages, pricer ? &*pricer : nullptr,
                       settled_early, skipped);
}

}  // namespace cpsched::search
