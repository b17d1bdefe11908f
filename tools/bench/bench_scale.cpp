// Scale of the core paths (docs/bounds.md, "Solvers"): a million slices validated, gridded,
// placed, planned and measured at P = 64. Target on the 2-core reference
// machine: validate + grid + solve + plan (with its metrics) <= 10 s per mask.
//
// Masks (S = P x 16384 tokens, GQA 64:8 flattened):
//   block_sparse    N random 64 x 64 full blocks (distinct, seeded)
//   column_stripes  N one-token column stripes, each one q block high (q block b
//                   takes cols b, b + P, b + 2P, ...): every cell holds N / P^2 stripes
//   full_stripes    N one-token column stripes over all rows (S = N): the
//                   validation's worst case; planned only up to N x P = 2^22 pieces
//
//   causal          one causal sequence (the P = 1024 and 4096 latency cases)
//
//   bench_scale [--slices N] [--cp P] [--solver owner|binary_greedy] [--repeats R] [--mask a,b]
//               [--cost area|time] [--hardware PROFILE] [--flatten 1|0]
// --cost time gives the solver the `time` cost model on the profile (default
// h100_8x_nvlink), as the default config does; area is the seed's model.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_common.hpp"
#include "cpsched/base/stopwatch.hpp"
#include "cpsched/session/solve_path.hpp"
#include "cpsched/session/session.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/problem/resources.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/plugin/cost_model.hpp"

using namespace cpsched;

namespace {

RangeMask block_sparse(Token S, std::int64_t n, std::uint64_t seed) {
  const Token bs = 64, nblk = S / bs;
  std::mt19937_64 rng(seed);
  // Per block row, a sorted set of distinct block columns (n / nblk each, the
  // remainder on the first rows).
  std::vector<Slice> slices;
  slices.reserve(static_cast<std::size_t>(n));
  std::vector<Token> cols;
  for (Token r = 0; r < nblk; ++r) {
    const std::int64_t want = std::min<std::int64_t>(nblk, n / nblk + (r < n % nblk ? 1 : 0));
    cols.clear();
    while (static_cast<std::int64_t>(cols.size()) < want) {
      for (std::int64_t i = static_cast<std::int64_t>(cols.size()); i < want; ++i)
        cols.push_back(static_cast<Token>(rng() % static_cast<std::uint64_t>(nblk)));
      std::sort(cols.begin(), cols.end());
      cols.erase(std::unique(cols.begin(), cols.end()), cols.end());
    }
    for (Token c : cols) slices.push_back({{r * bs, r * bs + bs}, {c * bs, c * bs + bs}, MaskType::full});
  }
  // Slice order as a user would give it: shuffled.
  std::shuffle(slices.begin(), slices.end(), rng);
  return RangeMask(S, std::move(slices));
}

RangeMask column_stripes(Token S, int P, std::int64_t n) {
  const Token shard = S / P, per_block = n / P;
  std::vector<Slice> slices;
  slices.reserve(static_cast<std::size_t>(n));
  for (Token j = 0; j < per_block; ++j)
    for (Token b = 0; b < P; ++b) {
      const Token k = (j * P + b) % S;
      slices.push_back({{b * shard, (b + 1) * shard}, {k, k + 1}, MaskType::full});
    }
  return RangeMask(S, std::move(slices));
}

RangeMask full_stripes(std::int64_t n) {
  std::vector<Slice> slices;
  slices.reserve(static_cast<std::size_t>(n));
  for (Token j = 0; j < n; ++j) slices.push_back({{0, n}, {j, j + 1}, MaskType::full});
  return RangeMask(n, std::move(slices));
}

}  // namespace

int main(int argc, char** argv) {
  bench::check_args(argc, argv, "bench_scale", {"--slices", "--cp", "--repeats", "--solver", "--mask", "--flatten", "--cost", "--hardware"});
  try {
    using bench::arg;
    const std::int64_t n = std::stoll(arg(argc, argv, "--slices", "1000000"));
    const int P = std::stoi(arg(argc, argv, "--cp", "64"));
    const int repeats = std::max(1, std::stoi(arg(argc, argv, "--repeats", "3")));
    const std::string solver_name = arg(argc, argv, "--solver", "owner");
    const std::vector<std::string> masks = bench::split(arg(argc, argv, "--mask", "block_sparse,column_stripes,full_stripes"));
    const Token S = Token{P} * 16384;
    const Heads heads{64, 8, 128, 2};

    auto reg = std::make_shared<Registry>();
    reg->scan_default_folders();
    bool found = false;
    for (const PluginInfo& p : reg->plugins()) found |= p.kind == PluginKind::solver && p.name == solver_name;
    if (!found) throw Error(fmt::format("bench_scale: solver plugin '{}' not found (build the plugins)", solver_name));
    auto solver = reg->make_solver(solver_name, reg->resolve_params(reg->find(PluginKind::solver, solver_name), {}));
    const bool flatten = arg(argc, argv, "--flatten", "1") != "0";
    const std::string cost_name = arg(argc, argv, "--cost", "area");
    if (cost_name != "area" && cost_name != "time") throw Error("bench_scale: --cost must be area or time");
    std::unique_ptr<CostModel> cost_model;
    if (cost_name == "time")
      cost_model = std::make_unique<TimeCostModel>(resolve_hardware_profile(arg(argc, argv, "--hardware", kDefaultHardwareProfile)));
    else
      cost_model = std::make_unique<AreaCostModel>();
    const CostModel& cost = *cost_model;

    fmt::print("bench_scale: P = {}, GQA 64:8 {}, solver {} ({} cost model), {} slices, median of {} repeats (ms; solve may run threads)\n", P,
               flatten ? "flattened" : "not flattened", solver_name, cost_name, n, repeats);
    fmt::print("{:<15} {:>11} {:>9} {:>9} {:>9} {:>9} {:>12} {:>10} {:>10} {:>10}\n", "mask", "S", "validate",
               "estimate", "grid", "solve", "plan+metrics", "total", "total cpu", "tasks");
    for (const std::string& kind : masks) {
      std::vector<double> tv, te, tg, ts, tp, tt, cpu;
      std::int64_t tasks = 0;
      ResourceEstimate est;
      Token seqlen = 0;
      for (int r = 0; r < repeats; ++r) {
        RangeMask mask = kind == "block_sparse"     ? block_sparse(S, n, 42)
                         : kind == "column_stripes" ? column_stripes(S, P, n)
                         : kind == "full_stripes"   ? full_stripes(n)
                         : kind == "causal"         ? RangeMask(S, {Slice{{0, S}, {0, S}, MaskType::causal}})
                                                    : throw Error("bench_scale: unknown mask " + kind);
        seqlen = mask.seqlen();
        // Process CPU time beside the wall clock: the reference machine's two
        // cores are shared, and CPU time shows the work without the waiting.
        const std::clock_t c0 = std::clock();
        auto t0 = std::chrono::steady_clock::now();
        auto problem = std::make_shared<const Problem>(Problem::make(std::move(mask), P, heads, {flatten, 1}));
        tv.push_back(ms_since(t0));
        // Full-height stripes put every stripe in every q block: planned only
        // while that stays small (the 10k-20k stripes at P = 8).
        if (kind == "full_stripes" && n * P > (std::int64_t{1} << 22)) {
          cpu.push_back(1000.0 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
          continue;
        }
        t0 = std::chrono::steady_clock::now();
        check_resources(*problem);
        te.push_back(ms_since(t0));
        est = estimate_resources(*problem);
        t0 = std::chrono::steady_clock::now();
        auto grid = std::make_shared<const TaskGrid>(problem);
        tg.push_back(ms_since(t0));
        tasks = grid->task_count();
        // The host's solve path on the grid built above; its plan time
        // includes the metrics (from the builder's transfers).
        const SolveResult res = SolvePath(*solver, cost, *reg).run(grid, {.shape = PlanShape{}, .uses = std::nullopt, .validate = false, .rank = -1, .solver_name = solver_name});
        ts.push_back(res.solve_ms);
        tp.push_back(res.plan_ms);
        const Metrics& m = res.metrics;
        tt.push_back(tv.back() + te.back() + tg.back() + ts.back() + tp.back());
        cpu.push_back(1000.0 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
        if (m.fwd.total_send < 0) throw Error("bench_scale: negative bytes");
      }
      if (est.blocks > 0)
        fmt::print("  estimate: grid {}, plan {} ({} cells, {} pieces)\n", format_bytes(static_cast<double>(est.grid_bytes)),
                   format_bytes(static_cast<double>(est.plan_bytes)), est.cells, est.touches);
      auto med = [](std::vector<double> v) {
        if (v.empty()) return std::string("-");
        std::sort(v.begin(), v.end());
        return fmt::format("{:.0f}", v[v.size() / 2]);
      };
      fmt::print("{:<15} {:>11} {:>9} {:>9} {:>9} {:>9} {:>12} {:>10} {:>10} {:>10}\n", kind, seqlen, med(tv),
                 med(te), med(tg), med(ts), med(tp), med(tt.empty() ? tv : tt), med(cpu), tasks);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
  return 0;
}
