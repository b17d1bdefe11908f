#include "balanced_bytes.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <cstdio>
#include <thread>

#include <cpsched/error.hpp>

#include "byte_model.hpp"
#include "placements.hpp"
#include "search.hpp"
#include "state.hpp"
#ifdef CPSCHED_BYTES_WITH_BINARY_GREEDY
#include "binary_greedy/solver.hpp"
#endif

namespace cpsched::bytes {

namespace {

std::string num(double v, const char* fmt = "%.6g") {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

[[noreturn]] void bad(const std::string& name, const std::string& value, const std::string& why) {
  throw Error("balanced_bytes: " + name + " = " + value + " " + why);
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

// Runs jobs 0..n-1 on up to `threads` threads; each writes its own slot, so
// the results do not depend on the thread count.
template <class F>
void run_jobs(std::size_t n, int threads, F&& job) {
  const auto workers = static_cast<std::size_t>(std::max(1, std::min<int>(threads, static_cast<int>(n))));
  if (workers <= 1) {
    for (std::size_t i = 0; i < n; ++i) job(i);
    return;
  }
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        job(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (std::size_t w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

Options parse_options(const Params& p) {
  Options o;
  o.mu = p.get_real("mu");
  o.fwd_weight = p.get_real("fwd_weight");
  o.bwd_weight = p.get_real("bwd_weight");
  o.bottleneck_weight = p.get_real("bottleneck_weight");
  o.effort = p.get_int("effort");
  const std::int64_t threads = p.get_int("threads");
  const std::int64_t blocks = p.get_int("max_blocks_per_rank");
  const std::int64_t degree = p.get_int("usp_max_degree");
  o.binary_greedy = p.get_bool("binary_greedy");
  o.binary_greedy_max_tasks = p.get_int("binary_greedy_max_tasks");
  o.seed = static_cast<std::uint64_t>(p.get_int("seed"));
  if (!(o.mu >= 1.0)) bad("mu", num(o.mu), "must be >= 1 (balance target: max load <= mu x mean)");
  if (!(o.fwd_weight >= 0.0)) bad("fwd_weight", num(o.fwd_weight), "must be >= 0");
  if (!(o.bwd_weight >= 0.0)) bad("bwd_weight", num(o.bwd_weight), "must be >= 0");
  if (!(o.fwd_weight + o.bwd_weight > 0.0))
    bad("fwd_weight + bwd_weight", num(o.fwd_weight + o.bwd_weight), "must be > 0 (nothing would be priced)");
  if (!(o.bottleneck_weight >= 0.0)) bad("bottleneck_weight", num(o.bottleneck_weight), "must be >= 0");
  if (o.effort < 0) bad("effort", std::to_string(o.effort), "must be >= 0 (move evaluations per start)");
  if (threads < 0) bad("threads", std::to_string(threads), "must be >= 0 (0: hardware threads, at most 8)");
  if (blocks < 1 || blocks > 1024) bad("max_blocks_per_rank", std::to_string(blocks), "must be in [1, 1024]");
  if (o.binary_greedy_max_tasks < 0)
    bad("binary_greedy_max_tasks", std::to_string(o.binary_greedy_max_tasks), "must be >= 0");
  if (degree < 1) bad("usp_max_degree", std::to_string(degree), "must be >= 1");
  o.threads = threads > 0 ? static_cast<int>(std::min<std::int64_t>(threads, 256))
                          : static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1U, 8U));
  o.max_blocks_per_rank = static_cast<int>(blocks);
  o.usp_max_degree = static_cast<int>(std::min<std::int64_t>(degree, 1 << 20));
  return o;
}

std::int64_t search_budget(const Options& o, TaskId tasks) {
  // Up to 256 tasks the full effort; beyond, effort x 256 / tasks, so that
  // the search costs about the same time at any size (latency).
  const double scale = std::min(1.0, 256.0 / static_cast<double>(std::max<TaskId>(tasks, 1)));
  return static_cast<std::int64_t>(static_cast<double>(o.effort) * scale);
}

Candidate BalancedBytes::solve_grid(const SolveInput& in, std::vector<Candidate>& seen) const {
  const TaskGrid& grid = *in.grid;
  const ByteModel model(grid, opt_.fwd_weight, opt_.bwd_weight);
  const std::int64_t cap = balance_cap(grid, opt_.mu);
  const double bw = opt_.bottleneck_weight;
  const std::int64_t total = search_budget(opt_, grid.num_tasks());

  // The starts: placements of the portfolio's members.
  struct Start {
    std::string origin;
    std::vector<Rank> rank;  // empty: computed in its job (binary_greedy)
  };
  std::vector<Start> starts;
  starts.push_back({"owner", owner_placement(grid)});
  if (grid.flattened()) starts.push_back({"usp", usp_placement(grid, opt_.usp_max_degree)});
#ifdef CPSCHED_BYTES_WITH_BINARY_GREEDY
  if (opt_.binary_greedy && grid.num_tasks() <= opt_.binary_greedy_max_tasks) starts.push_back({"binary_greedy", {}});
#endif

  // Phase 1, one job per start: repair, descend, a short iterated search.
  const std::size_t n = starts.size();
  std::vector<Candidate> raw(n);
  std::vector<std::unique_ptr<State>> states(n);
  run_jobs(n, opt_.threads, [&](std::size_t i) {
    std::vector<Rank> rank = std::move(starts[i].rank);
#ifdef CPSCHED_BYTES_WITH_BINARY_GREEDY
    if (rank.empty()) {
      Params p;
      p.set("mu", opt_.mu);
      p.set("epsilon", 0.01);
      p.set("max_iters", std::int64_t{20});
      p.set("refine_passes", std::int64_t{5});
      p.set("threads", std::int64_t{1});
      bg::BinaryGreedySolver solver(p);
      rank = solver.solve(in).rank;
    }
#endif
    auto st = std::make_unique<State>(model, rank, cap, bw);
    raw[i] = {starts[i].origin, std::move(rank), st->excess(), st->objective()};
    Budget budget{total / static_cast<std::int64_t>(2 * n)};
    repair(*st, budget);
    descend(*st, budget);
    iterate(*st, budget, opt_.seed + i);
    states[i] = std::move(st);
  });
  // (Incremental sums: exact for integer weights, else off by rounding only.)
  auto searched_of = [&](std::size_t i) {
    return Candidate{raw[i].origin + "+search", states[i]->placement(), states[i]->excess(), states[i]->objective()};
  };
  std::vector<Candidate> searched(n);
  for (std::size_t i = 0; i < n; ++i) searched[i] = searched_of(i);

  // Phase 2: the best searched start gets the other half of the effort.
  std::size_t lead = 0;
  for (std::size_t i = 1; i < n; ++i)
    if (better(searched[i], searched[lead])) lead = i;
  Budget rest{total / 2};
  iterate(*states[lead], rest, opt_.seed + 1000);
  Candidate final_cand = searched_of(lead);

  const std::size_t first = seen.size();
  for (auto& c : raw) seen.push_back(std::move(c));
  for (auto& c : searched) seen.push_back(std::move(c));
  seen.push_back(std::move(final_cand));
  std::size_t best = first;
  for (std::size_t i = first; i < seen.size(); ++i)
    if (better(seen[i], seen[best])) best = i;
  return seen[best];
}

Assignment BalancedBytes::solve(const SolveInput& in) {
  if (!in.grid) throw Error("balanced_bytes: no task grid given");
  std::vector<Candidate> seen;
  Candidate best = solve_grid(in, seen);
  std::shared_ptr<const TaskGrid> best_grid = in.grid;
  const std::size_t on_input_grid = seen.size();

  // No placement met the cap (a cell alone, or a few big ones, break the
  // balance): cut every shard into more blocks and search again.
  int blocks = in.grid->problem().grid.blocks_per_rank;
  std::shared_ptr<const TaskGrid> grid = in.grid;
  while (best.excess > 0 && is_sequential(*grid) && blocks * 2 <= opt_.max_blocks_per_rank) {
    blocks *= 2;
    grid = finer_grid(*grid, blocks);
    Candidate c = solve_grid({grid, in.cost}, seen);
    if (better(c, best)) {
      best = std::move(c);
      best_grid = grid;
    }
  }

  Assignment a;
  a.grid = best_grid;
  a.rank = std::move(best.rank);
  a.feasible = best.excess == 0;
  a.note = "balanced_bytes: " + best.origin + " on " + std::to_string(best_grid->problem().grid.blocks_per_rank) +
           " block(s) per rank, objective " + num(best.objective, "%.6e");
  for (std::size_t i = 0; i < on_input_grid; ++i)
    if (seen[i].origin.find('+') == std::string::npos)
      a.note += "; " + seen[i].origin + " " + num(seen[i].objective, "%.6e") +
                (seen[i].excess > 0 ? " (above cap)" : "");
  if (!a.feasible) a.note += "; no placement met mu = " + num(opt_.mu) + ", returned the least overloaded";
  return a;
}

}  // namespace cpsched::bytes
