// The library facade (cpsched.hpp): plugins loaded once, solve -> plan ->
// metrics per mask, with the plan cache in front.
#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "cpsched/base/stopwatch.hpp"
#include "cpsched/session/session.hpp"
#include "ahead_queue.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/io/input_file.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/mask/index/summary.hpp"

namespace cpsched {

namespace {

std::shared_ptr<Registry> default_registry(const std::vector<std::filesystem::path>& extra) {
  auto reg = std::make_shared<Registry>();
  reg->scan_default_folders(extra);
  return reg;
}

void check_options(const SessionOptions& o) {
  if (o.cp_size < 1) throw Error(fmt::format("session: cp_size must be at least 1, got {}", o.cp_size));
  o.plan.validate("session");
  if (o.uses) o.uses->validate("session");
  if (o.rank < -1 || o.rank >= o.cp_size)
    throw Error(fmt::format("session: rank must be -1 (every rank's plan) or in [0, cp_size = {}), got {}", o.cp_size,
                            o.rank));
  if (o.seqlen < 0) throw Error(fmt::format("session: seqlen must not be negative, got {}", o.seqlen));
  if (o.ahead_queue < 1) throw Error("session: ahead_queue must be at least 1, got 0");
  // Folders the caller names must exist (a typo would otherwise only mean "plugin not found").
  for (std::size_t i = 0; i < o.plugin_paths.size(); ++i) {
    try {
      check_input_folder(o.plugin_paths[i], "plugin folder");
    } catch (const Error& e) {
      throw Error(fmt::format("session: plugin_paths[{}]: {}", i, e.what()));
    }
  }
  if (o.memory_budget < 0)
    throw Error(fmt::format("session: memory_budget must be 0 (the default) or a number of bytes, got {}",
                            o.memory_budget));
}

}  // namespace

struct Session::Impl {
  SessionOptions opt;
  std::shared_ptr<Registry> reg;
  Params solver_params, cost_params;  // resolved
  std::unique_ptr<Solver> solver;
  std::unique_ptr<CostModel> cost;
  std::unique_ptr<SolvePath> path;
  PlanCache cache;
  std::optional<Config> config;  // a Session built from a Config
  std::shared_ptr<const SolveResult> last;
  // Index pools and a rank's sorted top-k rows (tens of MiB each for a DSA
  // layer) reuse the buffers of results already let go: mapped once, not
  // faulted in on every call.
  BufferRecycler buffers{4};
  bool last_cached = false;
  double last_ms = 0.0;
  // One solve at a time: the solver, cost model and pricer are shared by
  // solve() and the planning-ahead thread.
  std::mutex run_mu;
  std::unique_ptr<detail::AheadQueue> ahead;  // made by the first solve_async; destroyed first

  Impl(SessionOptions o, std::shared_ptr<Registry> r, const Config* cfg)
      : opt(std::move(o)), reg(std::move(r)), cache(opt.cache_size) {
    check_options(opt);
    // The process's budget for every later check (grids built by solvers too).
    if (opt.memory_budget > 0) set_memory_budget(opt.memory_budget, "SessionOptions::memory_budget");
    if (!reg) reg = default_registry(opt.plugin_paths);
    if (cfg != nullptr) {
      // Config selections: errors carry the config's file:line:column.
      solver_params = resolve_selection(*reg, static_cast<int>(PluginKind::solver), cfg->solver);
      cost_params = resolve_selection(*reg, static_cast<int>(PluginKind::cost_model), cfg->cost_model);
      config = *cfg;
    } else {
      solver_params = reg->resolve_params(reg->find(PluginKind::solver, opt.solver), opt.solver_params);
      cost_params = reg->resolve_params(reg->find(PluginKind::cost_model, opt.cost_model), opt.cost_params);
    }
    solver = reg->make_solver(opt.solver, solver_params);
    cost = reg->make_cost_model(opt.cost_model, cost_params);
    path = std::make_unique<SolvePath>(*solver, *cost, *reg);
  }

  ~Impl() { ahead.reset(); }  // joins the planning-ahead thread while the solver is alive

  // Per-rank top-k summaries: owner's placement (every query on its host),
  // this rank's plan only.
  std::unique_ptr<Solver> owner;
  std::unique_ptr<SolvePath> owner_path;
  const SolveResult& solve_owner(std::shared_ptr<const Problem> problem, std::chrono::steady_clock::time_point t0) {
    std::lock_guard lock(run_mu);
    if (!owner) {
      owner = reg->make_solver("owner", reg->resolve_params(reg->find(PluginKind::solver, "owner"), {}));
      owner_path = std::make_unique<SolvePath>(*owner, *cost, *reg);
    }
    // No relays: a rank's own plan does not say which forwarding phases the
    // other ranks run (a runtime issuing collectives from it must know).
    PlanShape shape = opt.plan;
    shape.relay = PlanShape::Relay::off;
    shape.node_size = 0;
    last = std::make_shared<const SolveResult>(owner_path->run(
        std::move(problem),
        {.shape = shape, .uses = opt.uses, .validate = opt.validate, .rank = opt.rank, .solver_name = "owner",
         .buffers = &buffers}));
    last_cached = false;
    last_ms = ms_since(t0);
    return *last;
  }

  PlanKey range_key(const RangeMask& mask) const {
    if (mask.seqlen() <= 0) throw Error(fmt::format("session: sequence length must be positive, got {}", mask.seqlen()));
    const Sharding sh = opt.host_ranges.empty()
                            ? Sharding::sequential(mask.seqlen(), opt.cp_size, opt.grid.blocks_per_rank)
                            : Sharding::of_host_ranges(mask.seqlen(), opt.host_ranges);
    return make_plan_key(mask.seqlen(), mask.slices(), opt.heads, opt.grid, sh, opt.layout, opt.solver, solver_params,
                         opt.cost_model, cost_params, opt.plan, opt.uses.value_or(default_uses(opt.layout)));
  }

  std::shared_ptr<const Problem> range_problem(const RangeMask& mask) const {
    Problem p = Problem::make(mask, opt.cp_size, opt.heads, opt.grid);
    p.set_layout(opt.layout, opt.host_ranges);
    return std::make_shared<const Problem>(std::move(p));
  }

  std::shared_ptr<const SolveResult> run(std::shared_ptr<const Problem> problem) {
    std::lock_guard lock(run_mu);
    return std::make_shared<const SolveResult>(path->run(
        std::move(problem),
        {.shape = opt.plan, .uses = opt.uses, .validate = opt.validate, .rank = opt.rank, .solver_name = opt.solver,
         .buffers = &buffers}));
  }

  const SolveResult& solve(const RangeMask& mask) {
    const auto t0 = std::chrono::steady_clock::now();
    const PlanKey key = range_key(mask);
    if (const SolveResult* r = cached(key, t0)) return *r;
    return solve_problem(range_problem(mask), &key, t0);
  }

  detail::ResultFuture solve_async(const RangeMask& mask) {
    const PlanKey key = range_key(mask);
    if (!ahead)
      ahead = std::make_unique<detail::AheadQueue>([this](std::shared_ptr<const Problem> p) { return run(std::move(p)); },
                                                   cache, opt.ahead_queue);
    return ahead->submit(key, [&] { return range_problem(mask); });
  }

  // Index masks are not cached: an indexer's selection changes every step,
  // and a key would hash the whole index tensor.
  const SolveResult& solve(const IndexMask& mask) {
    const auto t0 = std::chrono::steady_clock::now();
    if (opt.seqlen > 0 && mask.seqlen != opt.seqlen)
      throw Error(fmt::format("session: the index mask has S = {} tokens but the session's seqlen is {}", mask.seqlen,
                              opt.seqlen));
    Problem p = Problem::make(std::make_shared<const IndexMask>(mask), opt.cp_size, opt.heads, opt.grid);
    p.set_layout(opt.layout, opt.host_ranges);
    return solve_problem(std::make_shared<const Problem>(std::move(p)), nullptr, t0);
  }

  const SolveResult& solve(std::shared_ptr<const Problem> problem) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!problem) throw Error("session: no problem given");
    const Problem& p = *problem;
    if (p.cp_size() != opt.cp_size || !(p.heads == opt.heads) || !(p.grid == opt.grid))
      throw Error("session: the problem's P, heads or grid options differ from the session's");
    if (!p.index_mask && p.head_masks.empty()) {
      // Range masks go through the cache, keyed by the problem itself (its
      // layout and shards included).
      const PlanKey key = make_plan_key(p, opt.solver, solver_params, opt.cost_model, cost_params, opt.plan,
                                        opt.uses.value_or(default_uses(p.layout)));
      if (const SolveResult* r = cached(key, t0)) return *r;
      return solve_problem(std::move(problem), &key, t0);
    }
    return solve_problem(std::move(problem), nullptr, t0);
  }

  // The cache's entry for `key` (or the result of the same mask planned
  // ahead, once it is done) as the last result, or null.
  const SolveResult* cached(const PlanKey& key, std::chrono::steady_clock::time_point t0) {
    std::shared_ptr<const SolveResult> hit;
    if (ahead)
      if (auto f = ahead->in_flight(key)) hit = f->get();  // rethrows the solver's error
    if (!hit) hit = cache.find(key);
    if (!hit) return nullptr;
    last = std::move(hit);
    last_cached = true;
    last_ms = ms_since(t0);
    return last.get();
  }

  const SolveResult& solve_problem(std::shared_ptr<const Problem> problem, const PlanKey* key,
                                   std::chrono::steady_clock::time_point t0) {
    auto out = run(std::move(problem));
    if (key != nullptr) cache.insert(*key, out);
    last = std::move(out);
    last_cached = false;
    last_ms = ms_since(t0);
    return *last;
  }

  const SolveResult& need() const {
    if (!last) throw Error("session: nothing solved yet (call solve first)");
    return *last;
  }
  const PassPlan& pass(Rank r, Pass p) const {
    const Plan& plan = *need().plan;
    if (r < 0 || static_cast<std::size_t>(r) >= plan.ranks.size())
      throw Error(fmt::format("session: rank {} is outside [0, {})", r, plan.ranks.size()));
    if (plan.only_rank >= 0 && r != plan.only_rank)
      throw Error(fmt::format("session: this session builds rank {}'s plan only (SessionOptions::rank), not rank {}'s",
                              plan.only_rank, r));
    return p == Pass::fwd ? plan.ranks[static_cast<std::size_t>(r)].fwd : plan.ranks[static_cast<std::size_t>(r)].bwd;
  }
};

Session::Session(SessionOptions options, std::shared_ptr<Registry> registry)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(registry), nullptr)) {}

Session::Session(const Config& config, std::shared_ptr<Registry> registry)
    : impl_(std::make_unique<Impl>(options_from(config), std::move(registry), &config)) {}

Session::Session(const Config& config, Rank rank, std::shared_ptr<Registry> registry)
    : impl_(std::make_unique<Impl>(
          [&] {
            SessionOptions o = options_from(config);
            o.rank = rank;
            return o;
          }(),
          std::move(registry), &config)) {}

Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

SessionOptions Session::options_from(const Config& c) {
  SessionOptions o;
  o.cp_size = c.cp_size;
  o.seqlen = c.seqlen();
  o.heads = c.heads;
  o.grid = c.grid;
  o.layout = c.layout;
  o.host_ranges = c.host_ranges;
  o.solver = c.solver.name;
  o.solver_params = c.solver.given_params();
  o.cost_model = c.cost_model.name;
  o.cost_params = c.cost_model.given_params();
  o.plan = c.plan;
  o.uses = c.uses;
  // Relays need the node size: the config's hardware profile (the plugins' default when none is named).
  if (o.plan.relay != PlanShape::Relay::off && o.plan.node_size == 0)
    o.plan.node_size =
        resolve_hardware_profile(c.hardware.empty() ? kDefaultHardwareProfile : c.hardware).gpus_per_node;
  o.cache_size = static_cast<std::size_t>(std::max(0, c.cache_size));
  o.memory_budget = c.memory_budget;
  o.plugin_paths = c.plugin_paths;
  return o;
}

namespace {

// The seed's three lists as a range mask; S: the session's, or the largest range end.
RangeMask seed_lists_mask(Token seqlen, const std::vector<Range>& q_ranges, const std::vector<Range>& k_ranges,
                          const std::vector<MaskType>& types) {
  if (q_ranges.size() != k_ranges.size() || q_ranges.size() != types.size())
    throw Error(fmt::format("session: {} q ranges, {} k ranges and {} mask types (must be equal)", q_ranges.size(),
                            k_ranges.size(), types.size()));
  std::vector<Slice> slices(q_ranges.size());
  Token S = seqlen;
  for (std::size_t i = 0; i < slices.size(); ++i) {
    slices[i] = Slice{q_ranges[i], k_ranges[i], types[i]};
    if (seqlen == 0) S = std::max({S, q_ranges[i].end, k_ranges[i].end});
  }
  return RangeMask(S, std::move(slices));
}

}  // namespace

const SolveResult& Session::solve(const std::vector<Range>& q_ranges, const std::vector<Range>& k_ranges,
                                 const std::vector<MaskType>& types) {
  return impl_->solve(seed_lists_mask(impl_->opt.seqlen, q_ranges, k_ranges, types));
}

std::shared_future<std::shared_ptr<const SolveResult>> Session::solve_async(const std::vector<Range>& q_ranges,
                                                                            const std::vector<Range>& k_ranges,
                                                                            const std::vector<MaskType>& types) {
  return impl_->solve_async(seed_lists_mask(impl_->opt.seqlen, q_ranges, k_ranges, types));
}

const SolveResult& Session::solve(const RangeMask& mask) { return impl_->solve(mask); }

std::shared_future<std::shared_ptr<const SolveResult>> Session::solve_async(const RangeMask& mask) {
  return impl_->solve_async(mask);
}
const SolveResult& Session::solve(const IndexMask& mask) { return impl_->solve(mask); }
const SolveResult& Session::solve(std::shared_ptr<const Problem> problem) { return impl_->solve(std::move(problem)); }

const SolveResult& Session::solve_topk(std::span<const std::int32_t> indices, Token seqlen, int kv_heads, bool causal) {
  if (seqlen <= 0 || kv_heads <= 0 || indices.size() % static_cast<std::size_t>(seqlen * kv_heads) != 0)
    throw Error(fmt::format("session: {} top-k indices are not a whole [S = {}, kv_heads = {}, k] array", indices.size(),
                            seqlen, kv_heads));
  IndexMask m;
  m.kind = IndexMaskKind::topk;
  m.seqlen = seqlen;
  m.kv_heads = kv_heads;
  m.causal = causal;
  const auto k = static_cast<std::int64_t>(indices.size()) / (seqlen * kv_heads);
  m.indices = IndexArray::view(indices, {seqlen, kv_heads, k}, "<indices>");
  return impl_->solve(m);
}

namespace {

// The sizes of a per-rank top-k call, checked against the session.
void check_topk_sizes(const SessionOptions& o, Token S, int kv_heads) {
  if (o.rank < 0)
    throw Error("session: per-rank top-k summaries need the session's rank (SessionOptions::rank, Python rank=)");
  if (S <= 0 || kv_heads <= 0)
    throw Error(fmt::format("session: S = {} and kv_heads = {} must be positive", S, kv_heads));
  if (o.seqlen > 0 && S != o.seqlen)
    throw Error(fmt::format("session: the index mask has S = {} tokens but the session's seqlen is {}", S, o.seqlen));
}

// This rank's rows of a top-k mask as borrowed, checked against the session.
TopkRows own_topk_rows(const SessionOptions& o, std::span<const std::int32_t> rows, Token S, int kv_heads, bool causal) {
  check_topk_sizes(o, S, kv_heads);
  const Range mine = Sharding::sequential(S, o.cp_size, 1).blocks.at(static_cast<std::size_t>(o.rank));
  const std::int64_t per_row = mine.size() * kv_heads;
  if (per_row == 0 || static_cast<std::int64_t>(rows.size()) % per_row != 0)
    throw Error(fmt::format("session: rank {}'s {} top-k indices are not its rows [{}, {}) as [{}, kv_heads = {}, k]",
                            o.rank, rows.size(), mine.begin, mine.end, mine.size(), kv_heads));
  TopkRows t;
  t.seqlen = S;
  t.first_row = mine.begin;
  t.causal = causal;
  t.indices = IndexArray::view(rows, {mine.size(), kv_heads, static_cast<std::int64_t>(rows.size()) / per_row},
                               fmt::format("<rank {} indices>", o.rank));
  return t;
}

}  // namespace

std::vector<IndexCell> Session::summarize_topk(std::span<const std::int32_t> own_rows, Token seqlen, int kv_heads,
                                               bool causal) const {
  const SessionOptions& o = impl_->opt;
  const TopkRows t = own_topk_rows(o, own_rows, seqlen, kv_heads, causal);
  return summarize_topk_rows(t, Sharding::sequential(seqlen, o.cp_size, o.grid.blocks_per_rank).blocks);
}

namespace {

// The ranks' summaries (in rank order, each of its own query blocks) merged
// into the whole mask's.
std::shared_ptr<const IndexSummary> merged_summary(const SessionOptions& o,
                                                   const std::vector<std::vector<IndexCell>>& summaries, Token seqlen,
                                                   int kv_heads, bool causal) {
  if (summaries.size() != static_cast<std::size_t>(o.cp_size))
    throw Error(fmt::format("session: {} top-k summaries given for P = {} ranks (one per rank, in rank order)",
                            summaries.size(), o.cp_size));
  if (!o.host_ranges.empty())
    throw Error("session: per-rank top-k summaries plan the sequential shards; the session has host_ranges");
  auto summary = std::make_shared<IndexSummary>();
  summary->seqlen = seqlen;
  summary->kv_heads = kv_heads;
  summary->causal = causal;
  summary->blocks = Sharding::sequential(seqlen, o.cp_size, o.grid.blocks_per_rank).blocks;
  // Each rank's summary is checked as what that rank's own rows could give,
  // in rank order: every rank checks the same gathered summaries, so every
  // rank stops at the same one with the same error.
  const Sharding ranks = Sharding::sequential(seqlen, o.cp_size, 1);
  for (std::size_t r = 0; r < summaries.size(); ++r)
    check_rank_summary(summaries[r], summary->blocks, ranks.blocks[r], kv_heads, causal,
                       fmt::format("summaries[{}] (rank {}'s top-k summary)", r, r));
  summary->cells = merge_index_cells(summaries);
  return summary;
}

}  // namespace

const SolveResult& Session::solve_topk_summaries(const std::vector<std::vector<IndexCell>>& summaries,
                                                 std::span<const std::int32_t> own_rows, Token seqlen, int kv_heads,
                                                 bool causal) {
  const auto t0 = std::chrono::steady_clock::now();
  const SessionOptions& o = impl_->opt;
  // The gathered summaries first (the same on every rank), then this rank's rows.
  check_topk_sizes(o, seqlen, kv_heads);
  auto merged = merged_summary(o, summaries, seqlen, kv_heads, causal);
  const TopkRows t = own_topk_rows(o, own_rows, seqlen, kv_heads, causal);
  Problem p = Problem::make(std::move(merged), t, o.cp_size, o.heads, o.grid, &impl_->buffers);
  p.set_layout(Layout::fixed);
  return impl_->solve_owner(std::make_shared<const Problem>(std::move(p)), t0);
}

TopkRowRuns Session::summarize_topk_runs(std::span<const std::int32_t> own_rows, Token seqlen, int kv_heads,
                                         bool causal) const {
  const SessionOptions& o = impl_->opt;
  const TopkRows t = own_topk_rows(o, own_rows, seqlen, kv_heads, causal);
  return cpsched::summarize_topk_runs(t, Sharding::sequential(seqlen, o.cp_size, o.grid.blocks_per_rank).blocks);
}

const SolveResult& Session::solve_topk_runs(const std::vector<std::vector<IndexCell>>& summaries, TopkRowRuns own_runs) {
  const auto t0 = std::chrono::steady_clock::now();
  const SessionOptions& o = impl_->opt;
  // The gathered summaries first (the same on every rank), then this rank's runs.
  check_topk_sizes(o, own_runs.seqlen, own_runs.kv_heads);
  auto summary = merged_summary(o, summaries, own_runs.seqlen, own_runs.kv_heads, own_runs.causal);
  const Range mine = Sharding::sequential(own_runs.seqlen, o.cp_size, 1).blocks.at(static_cast<std::size_t>(o.rank));
  if (own_runs.rows != mine)
    throw Error(fmt::format("session: the row runs are of the queries [{}, {}), rank {}'s are [{}, {})",
                            own_runs.rows.begin, own_runs.rows.end, o.rank, mine.begin, mine.end));
  Problem p = Problem::make(std::move(summary), std::make_shared<const TopkRowRuns>(std::move(own_runs)), o.cp_size,
                            o.heads, o.grid);
  p.set_layout(Layout::fixed);
  return impl_->solve_owner(std::make_shared<const Problem>(std::move(p)), t0);
}

const SolveResult& Session::solve_config_mask() {
  if (!impl_->config) throw Error("session: solve_config_mask needs a Session built from a Config");
  // make_problem reports a mask's errors at their place in the config; range
  // masks then go through the cache, index masks do not.
  return impl_->solve(std::make_shared<const Problem>(make_problem(*impl_->config)));
}

const CalcMeta& Session::calc_meta(Rank rank, Pass pass) const { return impl_->pass(rank, pass).calc; }
const CommMeta& Session::comm_meta(Rank rank, Pass pass) const { return impl_->pass(rank, pass).comm; }
const Metrics& Session::metrics() const { return impl_->need().metrics; }
const Plan& Session::plan() const { return *impl_->need().plan; }
const Assignment& Session::assignment() const { return *impl_->need().assignment; }
const Problem& Session::problem() const { return impl_->need().assignment->grid->problem(); }
const SolveResult& Session::result() const { return impl_->need(); }
bool Session::last_was_cached() const { return impl_->last_cached; }
double Session::last_call_ms() const { return impl_->last_ms; }

void Session::write_svg(const std::filesystem::path& file, SvgOptions o) const {
  const SolveResult& r = impl_->need();
  if (o.solver.empty()) o.solver = impl_->opt.solver;
  if (o.stages == 0) o.stages = r.plan->num_stages;
  o.feasible = r.feasible;
  write_plan_svg(file, *r.assignment, r.metrics, o);
}

std::string Session::plan_json(int indent) const { return cpsched::plan_json(plan_export(), indent); }

PlanExport Session::plan_export() const {
  const SolveResult& r = impl_->need();
  PlanExport e;
  e.assignment = r.assignment.get();
  e.metrics = &r.metrics;
  e.plan = r.plan.get();
  // Plans from top-k summaries are owner's, whatever the session's solver.
  const bool own = r.solver.empty() || r.solver == impl_->opt.solver;
  e.solver = own ? impl_->opt.solver : r.solver;
  if (own) e.solver_params = impl_->solver_params;
  e.solve_ms = r.solve_ms;
  e.feasible = r.feasible;
  e.note = r.note;
  return e;
}

std::vector<std::string> Session::validate() const {
  return validate_result(impl_->need());
}

const SessionOptions& Session::options() const { return impl_->opt; }
const Params& Session::solver_params() const { return impl_->solver_params; }
const PlanCache& Session::cache() const { return impl_->cache; }
Registry& Session::registry() const { return *impl_->reg; }

}  // namespace cpsched
