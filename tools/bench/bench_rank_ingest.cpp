// Per-rank ingestion of a token top-k mask (docs/bounds.md, "Per-rank top-k
// ingestion": DSA from each rank's own index rows): what one rank of a run
// spends on a layer's mask, median of R repeats per rank, the slowest rank
// reported, 2-core numbers in docs/bounds.md. Beside it, the path it replaces:
// every rank given the whole [S, H_kv, k] tensor (after an all-gather this does
// not time) and solving it for its own plan (Session::solve_topk, rank = r).
//
//   bench_rank_ingest [--config configs/dsa.yaml] [--repeats 5] [--set key=value ...] [--no-whole]
//
// Per rank r (a Session with rank = r, the config's solver and cost model):
//   summarise  Session::summarize_topk of its own rows (the local work before the all-gather)
//   plan       Session::solve_topk_summaries: merge the P summaries, grid, owner's placement,
//              rank r's plan (of it, the plan build and its metrics)
//   whole      Session::solve_topk of the whole tensor, rank r's plan (the config's solver)
// The summaries of the other ranks are made once, outside the timing (in a
// run each rank makes its own at the same time).
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "cpsched/config/config.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/plan/deferred_index.hpp"
#include "cpsched/session/session.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/timing/model.hpp"

using namespace cpsched;

int main(int argc, char** argv) {
  bench::check_args(argc, argv, "bench_rank_ingest", {"--config", "--repeats", "--set"}, {"--no-whole"});
  try {
    const std::string file = bench::arg(argc, argv, "--config",
#ifdef CPSCHED_SOURCE_DIR
                                        std::string(CPSCHED_SOURCE_DIR) + "/configs/dsa.yaml"
#else
                                        "configs/dsa.yaml"
#endif
    );
    const int repeats = std::stoi(bench::arg(argc, argv, "--repeats", "5"));
    const bool no_whole = bench::flag(argc, argv, "--no-whole");
    std::vector<std::string> sets;
    for (int i = 1; i + 1 < argc; ++i)
      if (std::string(argv[i]) == "--set") sets.push_back(argv[i + 1]);
    const Config cfg = load_config(file, sets);
    if (!is_index_kind(cfg.mask.kind) || cfg.mask.kind == MaskKind::block_topk || cfg.mask.kind == MaskKind::bsr ||
        cfg.mask.kind == MaskKind::nsa)
      throw Error(fmt::format("bench_rank_ingest: {} is not a token top-k mask (topk or dsa)", to_string(cfg.mask.kind)));
    const IndexMask mask = make_index_mask(cfg.mask, cfg.seqlen());
    const Token S = mask.seqlen;
    const int P = cfg.cp_size, H = mask.kv_heads;
    const std::int64_t per_row = H * mask.indices.shape[2];
    const Sharding shards = Sharding::sequential(S, P, 1);
    auto own = [&](Rank r) {
      const Range q = shards.blocks[static_cast<std::size_t>(r)];
      return std::span<const std::int32_t>(mask.indices.data + q.begin * per_row,
                                           static_cast<std::size_t>(q.size() * per_row));
    };
    const std::span<const std::int32_t> all(mask.indices.data, static_cast<std::size_t>(mask.indices.size()));
    fmt::print("{}: S = {}, P = {}, top-k [{}, {}, {}] ({:.0f} MiB of indices; a rank's rows {:.1f} MiB), solver {}, "
               "median of {} per rank\n",
               file, S, P, S, H, mask.indices.shape[2], static_cast<double>(all.size_bytes()) / (1 << 20),
               static_cast<double>(own(0).size_bytes()) / (1 << 20), cfg.solver.name, repeats);

    std::vector<Session> sessions;
    std::vector<std::vector<IndexCell>> summaries;
    for (Rank r = 0; r < P; ++r) {
      SessionOptions o = Session::options_from(cfg);
      o.rank = r;
      sessions.emplace_back(o);
      summaries.push_back(sessions.back().summarize_topk(own(r), S, H, mask.causal));
    }
    // The steps of the two paths' plans (all ranks': a rank's own plan alone cannot be timed).
    const HardwareProfile hw = resolve_hardware_profile(cfg.hardware.empty() ? kDefaultHardwareProfile : cfg.hardware);
    for (const std::string& solver : {std::string("owner"), cfg.solver.name}) {
      if (no_whole) break;
      SessionOptions o = Session::options_from(cfg);
      o.solver = solver;
      o.solver_params = {};
      Session s(o);
      s.solve_topk(all, S, H, mask.causal);
      const StepEstimate e = estimate_step(s.problem(), s.plan(), hw);
      fmt::print("step of {}'s plan{}: {:.3f} ms, {:.3f} x the compute bound ({})\n", solver,
                 solver == "owner" ? " (the per-rank path's)" : " (the whole-tensor path's)", e.step() * 1e3,
                 e.ratio(), hw.name);
    }
    // What the all-gather carries: a summary as Python's TopkSummary holds it (int64 arrays).
    std::int64_t most = 0, all_bytes = 0;
    for (const auto& sm : summaries) {
      std::int64_t b = 4 * 8 * static_cast<std::int64_t>(sm.size()) + 2 * 8 * (static_cast<std::int64_t>(sm.size()) + 1);
      for (const IndexCell& c : sm)
        b += 16 * static_cast<std::int64_t>(c.rows.ranges().size() + c.cols.ranges().size());
      most = std::max(most, b);
      all_bytes += b;
    }
    fmt::print("summaries: {} bytes in all, at most {} per rank (the all-gather of the rows would move {:.0f} MiB to "
               "every rank)\n",
               all_bytes, most, static_cast<double>(all.size_bytes()) / (1 << 20));
    fmt::print("{:>5} {:>13} {:>10} {:>15} {:>10} {:>15}\n", "rank", "summarise ms", "plan ms", "of it build ms",
               "total ms", "whole-path ms");
    double worst_total = 0, worst_whole = 0;
    for (Rank r = 0; r < P; ++r) {
      Session& s = sessions[static_cast<std::size_t>(r)];
      const double sum_ms = bench::median_ms(repeats, [&] { (void)s.summarize_topk(own(r), S, H, mask.causal); });
      const double plan_ms =
          bench::median_ms(repeats, [&] { (void)s.solve_topk_summaries(summaries, own(r), S, H, mask.causal); });
      const double build_ms = s.result().plan_ms;  // of the last repeat
      const double whole_ms =
          no_whole ? 0.0 : bench::median_ms(repeats, [&] { (void)s.solve_topk(all, S, H, mask.causal); });
      worst_total = std::max(worst_total, sum_ms + plan_ms);
      worst_whole = std::max(worst_whole, whole_ms);
      fmt::print("{:>5} {:>13.2f} {:>10.2f} {:>15.2f} {:>10.2f} {:>15.2f}\n", r, sum_ms, plan_ms, build_ms,
                 sum_ms + plan_ms, whole_ms);
    }
    fmt::print("slowest rank: {:.2f} ms from its own rows (summarise + plan), {:.2f} ms from the whole tensor\n",
               worst_total, worst_whole);
    // The row runs path: the plan leaves its index rows to the executor (cpsched.torch writes them on the
    // device); the host's write is timed apart, as a host executor would pay it.
    fmt::print("\nfrom row runs (the index rows written by the executor):\n{:>5} {:>17} {:>10} {:>10} {:>22}\n",
               "rank", "summarise runs ms", "plan ms", "total ms", "write rows on host ms");
    double worst_runs = 0;
    for (Rank r = 0; r < P; ++r) {
      Session& s = sessions[static_cast<std::size_t>(r)];
      TopkRowRuns runs;
      const double sum_ms = bench::median_ms(repeats, [&] { runs = s.summarize_topk_runs(own(r), S, H, mask.causal); });
      const double plan_ms = bench::median_ms(repeats, [&] { (void)s.solve_topk_runs(summaries, runs); });
      TopkRows rows;
      rows.seqlen = S;
      rows.first_row = shards.blocks[static_cast<std::size_t>(r)].begin;
      rows.causal = mask.causal;
      rows.indices = IndexArray::view(own(r), {shards.blocks[static_cast<std::size_t>(r)].size(), H,
                                               mask.indices.shape[2]}, "own");
      const double write_ms = bench::median_ms(repeats, [&] {
        (void)write_deferred_index_rows(s.plan().ranks[static_cast<std::size_t>(r)].fwd, s.plan().sharding, r, rows);
      });
      worst_runs = std::max(worst_runs, sum_ms + plan_ms);
      fmt::print("{:>5} {:>17.2f} {:>10.2f} {:>10.2f} {:>22.2f}\n", r, sum_ms, plan_ms, sum_ms + plan_ms, write_ms);
    }
    fmt::print("slowest rank: {:.2f} ms from its row runs (summarise + plan)\n", worst_runs);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_rank_ingest: {}\n", e.what());
    return 1;
  }
}
