// What the cuDNN path makes of a config's plan, on the CPU (a benchmark, not
// a test): per rank and pass, the SDPA calls (batches), the cuDNN graphs to
// build (distinct geometries), the sequences, the rows bucketing adds, and
// the args and area left to the runtime's kernels. No device: only the
// translation (host/plan/sdpa_batches.hpp) runs.
//
//   bench_sdpa_plan CONFIG [--set key=value ...]
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cpsched/config/config.hpp"
#include "cpsched/session/session.hpp"
#include "host/plan/buffers.hpp"
#include "host/plan/sdpa_batches.hpp"

using namespace cpsched;
namespace g = cpsched::gpu;

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: bench_sdpa_plan CONFIG [--set key=value ...]\n");
    return 2;
  }
  std::vector<std::string> overrides;
  for (int i = 2; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--set") overrides.push_back(argv[i + 1]);
  try {
    const Config cfg = load_config(argv[1], overrides);
    Session session(cfg);
    const SolveResult& s = session.solve_config_mask();
    const Plan& plan = *s.plan;
    const g::HeadLayout h = g::HeadLayout::of(session.problem());
    fmt::print("{}: P = {}, {} tokens per rank, heads {}:{} D {}, {} stage(s)\n", argv[1], plan.sharding.cp_size,
               cfg.seqlen_per_rank, h.hq, h.hkv, h.dim, plan.num_stages);
    fmt::print("{:>5} {:>4} {:>8} {:>7} {:>6} {:>9} {:>9}  {}\n", "rank", "pass", "batches", "graphs", "seqs",
               "dummy %", "pad S %", "routes");
    for (Rank r = 0; r < plan.sharding.cp_size; ++r) {
      const RankPlan& rp = plan.ranks[static_cast<std::size_t>(r)];
      for (const auto& [pass, pp] : {std::pair{g::Pass::fwd, &rp.fwd}, std::pair{g::Pass::bwd, &rp.bwd}}) {
        const g::PassSdpa sd =
            g::plan_sdpa(*pp, pass, h, g::remote_shape(*pp, h), plan.sharding.rank_tokens(r).size(), g::SdpaPolicy{});
        std::vector<g::SdpaGeometry> geos;
        int batches = 0, seqs = 0, dummies = 0;
        double rows = 0, padded = 0;
        for (const auto& st : sd.batches)
          for (const g::SdpaBatch& b : st) {
            ++batches;
            seqs += b.real;
            dummies += static_cast<int>(b.seqs.size()) - b.real;
            if (std::find(geos.begin(), geos.end(), b.geo) == geos.end()) geos.push_back(b.geo);
            for (int i = 0; i < b.real; ++i) rows += static_cast<double>(b.seqs[static_cast<std::size_t>(i)].q_len);
            padded += static_cast<double>(b.geo.batch) * static_cast<double>(b.geo.max_q);
          }
        fmt::print("{:>5} {:>4} {:>8} {:>7} {:>6} {:>8.1f}% {:>8.1f}%  {}\n", r, g::to_string(pass), batches,
                   geos.size(), seqs, seqs + dummies > 0 ? 100.0 * dummies / (seqs + dummies) : 0.0,
                   padded > 0 ? 100.0 * (padded - rows) / padded : 0.0, sd.routes.summary.text());
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_sdpa_plan: {}\n", e.what());
    return 1;
  }
  return 0;
}
