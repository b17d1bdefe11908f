// KV traffic of index masks: the default
// solver's plan moves only the selected KV rows of each remote task; this
// prints those bytes against what gathering whole needed KV chunks (every
// kv block a rank computes a remote task of, whole) would move for the same
// placement: as rows, and priced per transfer as min(the whole chunk, the
// distinct rows + 8 index bytes per shipped range) (a runtime without a
// shared plan would send the ranges too; cpsched's ranks all hold the plan).
//
//   bench_sparse_traffic [--cp 8,16,32] [--tokens-per-rank 4096] [--packs 3]
//                        [--hardware h100_8x_nvlink] [--data-dir DIR]
// Workloads: `dsa` with its documented defaults (sinks 64 + local 512 +
// random keys, top-2048, inside the documents of histogram packs) and
// `uniform` (top-2048 keys uniform in [0, q], one document). Heads: DSA's
// MLA (128 q heads share one latent of 576 dims, V its first 512).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "bench_common.hpp"
#include "cpsched/plugin/cost_model.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/session/solve_path.hpp"
#include "cpsched/timing/model.hpp"
#include "cpsched/plugin/registry.hpp"

using namespace cpsched;

int main(int argc, char** argv) try {
  bench::check_args(argc, argv, "bench_sparse_traffic", {"--cp", "--tokens-per-rank", "--packs", "--hardware"});
  std::vector<int> cps;
  for (const std::string& s : bench::split(bench::arg(argc, argv, "--cp", "8,16,32"))) cps.push_back(std::stoi(s));
  const Token per_rank = std::stoll(bench::arg(argc, argv, "--tokens-per-rank", "4096"));
  const int packs = std::stoi(bench::arg(argc, argv, "--packs", "3"));
  const std::string hardware = bench::arg(argc, argv, "--hardware", kDefaultHardwareProfile);
  const auto hist = DocHistogram::load_csv(bench::data_file(argc, argv, "doc_length_distribution.csv"));

  Registry reg;
  reg.scan_default_folders();
  Params hw;
  hw.set("hardware", hardware);
  auto cost = reg.make_cost_model("time", reg.resolve_params(reg.find(PluginKind::cost_model, "time"), hw));
  auto solver = reg.make_solver("balanced_bytes", reg.resolve_params(reg.find(PluginKind::solver, "balanced_bytes"), {}));
  Heads heads{128, 1, 576, 2};
  heads.dim_v = 512;
  heads.kv_shared = true;

  fmt::print("KV traffic of the default plan (balanced_bytes, time cost model on {}) against gathering whole\n", hardware);
  fmt::print("needed KV chunks for the same placement; top-2048, MLA 128:1 (d 576 / 512, shared latent), {} tokens/rank\n\n",
             per_rank);
  fmt::print("{:>8} {:>4} {:>5} {:>13} {:>13} {:>9} {:>11} {:>10} {:>9}\n", "workload", "P", "pack", "moved rows",
             "whole chunks", "ratio", "+idx bytes", "step/bnd", "solve s");
  int over = 0;
  for (const std::string workload : {"dsa", "uniform"}) {
    for (int P : cps) {
      const Token S = per_rank * P;
      for (int pack = 0; pack < (workload == "dsa" ? packs : 1); ++pack) {
        MaskSpec spec;
        spec.kind = MaskKind::dsa;
        spec.topk = 2048;
        if (workload == "dsa") {
          spec.histogram = hist;
          spec.pack = pack;
        } else {
          spec.sink = 0;
          spec.local = 1;  // the query itself, then uniform keys below it
        }
        auto mask = std::make_shared<const IndexMask>(make_index_mask(spec, S));
        auto problem = std::make_shared<const Problem>(Problem::make(mask, P, heads));
        auto grid = std::make_shared<const TaskGrid>(problem);
        const SolveResult r = SolvePath(*solver, *cost, reg).run(grid, {.shape = PlanShape{PlanShape::kAutoStages}, .uses = std::nullopt, .validate = false, .rank = -1, .solver_name = "balanced_bytes"});
        const Assignment& a = *r.assignment;
        const double solve_s = r.solve_ms / 1e3;
        // Per (kv block, group, receiving rank): the selected keys it needs, and the whole block.
        std::map<std::tuple<std::int32_t, int, Rank>, RangeSet::Builder> need;
        const TaskGrid& g = *a.grid;
        for (TaskId t = 0; t < g.num_tasks(); ++t) {
          const Rank r = a.rank[static_cast<std::size_t>(t)];
          if (r == g.k_host(t) || g.area(t) == 0) continue;
          need[{g.cell_of(t).kblock, g.group_of(t), r}].add(g.cell_of(t).cols);
        }
        // The price of a transfer: min(the whole chunk, the distinct rows + their index bytes).
        const double row = static_cast<double>(heads.kv_row_bytes() * heads.kv);
        Token moved = 0, whole = 0;
        double priced = 0;
        for (auto& [key, b] : need) {
          const RangeSet s = b.build();
          const Token block = g.sharding().blocks[static_cast<std::size_t>(std::get<0>(key))].size();
          moved += s.size();
          whole += block;
          priced += std::min(static_cast<double>(block) * row,
                             static_cast<double>(s.size()) * row + 8.0 * static_cast<double>(s.ranges().size()));
        }
        const double ratio = whole > 0 ? static_cast<double>(moved) / static_cast<double>(whole) : 0.0;
        const double with_idx = whole > 0 ? priced / (static_cast<double>(whole) * row) : 0.0;
        over += with_idx > 1.0 ? 1 : 0;
        const StepEstimate pt = estimate_step(g.problem(), *r.plan, *cost->hardware());
        fmt::print("{:>8} {:>4} {:>5} {:>13} {:>13} {:>9.3f} {:>11.3f} {:>10.3f} {:>9.2f}\n", workload, P, pack, moved,
                   whole, ratio, with_idx, pt.ratio(), solve_s);
        std::fflush(stdout);
      }
    }
  }
  fmt::print("\nplacements where the selected rows (with index bytes) moved more than whole chunks: {}\n", over);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_sparse_traffic: {}\n", e.what());
  return 1;
}
