// Embedding cpsched in a training framework (the seed's "Direct Solver API"):
// one Session per model, one solve per attention mask, then the per-rank
// CalcMeta and CommMeta that drive the local and remote stages.
//
//   embed_api [solver [picture.svg]]     (default: binary_greedy, embed_api.svg)
#include <cstdio>
#include <string>
#include <vector>

#include <cpsched/session/session.hpp>
#include <cpsched/base/error.hpp>

int main(int argc, char** argv) {
  using namespace cpsched;
  const std::string solver = argc > 1 ? argv[1] : "binary_greedy";
  const std::string svg = argc > 2 ? argv[2] : "embed_api.svg";
  try {
    SessionOptions o;
    o.cp_size = 8;              // CP ranks
    o.seqlen = 8 * 1024;        // tokens of the packed sequence
    o.heads = {64, 8, 128, 2};  // GQA 64:8, head dim 128, bf16
    o.solver = solver;          // any solver plugin; its parameters default
    o.plan.stages = 2;          // two remote stages after the local one
    Session session(o);         // plugins from the build / installation and CPSCHED_PLUGIN_PATH

    // This step's mask, as the seed's lists: causal documents packed into one sequence.
    std::vector<Range> q_ranges, k_ranges;
    std::vector<MaskType> types;
    Token pos = 0;
    for (Token len : {3000, 1500, 700, 2300, 692}) {
      q_ranges.push_back({pos, pos + len});
      k_ranges.push_back({pos, pos + len});
      types.push_back(MaskType::causal);
      pos += len;
    }
    session.solve(q_ranges, k_ranges, types);

    // What each rank's executor reads.
    for (Rank r = 0; r < o.cp_size; ++r) {
      const CalcMeta& calc = session.calc_meta(r);
      const CommMeta& comm = session.comm_meta(r);
      std::printf("rank %d: %zu local args", r, calc.local_attn_args.size());
      for (std::size_t s = 0; s < comm.stages.size(); ++s)
        std::printf("; stage %zu: %zu args, receives %lld QO + %lld KV tokens", s + 1,
                    calc.remote_attn_args[s].size(), static_cast<long long>(comm.stages[s].num_remote_qo_tokens),
                    static_cast<long long>(comm.stages[s].num_remote_kv_tokens));
      std::printf("\n");
    }
    const Metrics& m = session.metrics();
    std::printf("forward total send %.3f MiB, bottleneck %.3f MiB, imbalance %.3f, stage-0 share %.1f %%\n",
                static_cast<double>(m.fwd.total_send) / (1 << 20), static_cast<double>(m.fwd.bottleneck) / (1 << 20),
                m.imbalance, 100 * m.stage0_share);
    std::printf("solve %.3f ms, plan %.3f ms\n", session.result().solve_ms, session.result().plan_ms);

    // The next layer with the same mask costs a cache look-up.
    session.solve(q_ranges, k_ranges, types);
    std::printf("second solve: %s in %.4f ms (cache hits %llu)\n", session.last_was_cached() ? "cache hit" : "solved",
                session.last_call_ms(), static_cast<unsigned long long>(session.cache().hits()));

    session.write_svg(svg);
    std::printf("picture: %s\n", svg.c_str());
    const std::vector<std::string> problems = session.validate();
    for (const std::string& p : problems) std::printf("plan problem: %s\n", p.c_str());
    std::printf("plan %s\n", problems.empty() ? "valid" : "INVALID");
    return problems.empty() && session.last_was_cached() ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "embed_api: %s\n", e.what());
    return 1;
  }
}
