// configs/dsa.yaml (DeepSeek sparse attention: token top-k over MLA's shared
// latent, d_qk 576 / d_v 512, 128 query heads on one latent row) through the
// whole runtime on the CPU emulation, P = 1, 2 and 4, self-checked against the
// sim running the same plan: the config's own geometry and selection (sinks,
// local window, random keys per document) at 128 tokens in two documents of
// 96 and 32, so that selections cross ranks, and 16 query heads (the
// emulation runs the kernels' programs one thread at a time).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cpsched/config/config.hpp"
#include "cpsched/session/session.hpp"
#include "host/run/rank_run.hpp"

using namespace cpsched;
namespace g = cpsched::gpu;

TEST_CASE("configs/dsa.yaml on the emulation matches the sim at P = 1, 2, 4 (MLA 576 / 512, shared latent)") {
  constexpr int kTokens = 128;
  for (const int P : {1, 2, 4}) {
    const Config cfg = load_config(std::string(CPSCHED_SOURCE_DIR) + "/configs/dsa.yaml",
                                   {"problem.cp_size=" + std::to_string(P),
                                    "problem.seqlen_per_rank=" + std::to_string(kTokens / P), "problem.heads.q=16",
                                    "problem.mask.lengths=[96, 32]"});
    Session session(cfg);
    const Plan& plan = *session.solve_config_mask().plan;
    const Problem& problem = session.problem();
    REQUIRE(problem.heads.dqk() == 576);
    REQUIRE(problem.heads.dv() == 512);
    REQUIRE(problem.heads.kv_shared);
    Params p;
    p.set("backend", std::string("emulate"));
    p.set("check", true);
    p.set("threads", std::int64_t{2});
    p.set("warmup", std::int64_t{0});
    p.set("iterations", std::int64_t{1});
    const ExecutionReport rep = g::run_emulated(problem, plan, g::parse_run_options(p), 5);
    INFO("P = ", P, ": ", rep.text);
    CHECK(rep.passed);
    CHECK(rep.text.find("dLatent (dK + dV)") != std::string::npos);
    CHECK(rep.text.find("passed") != std::string::npos);
    // Every arg is an index arg (token top-k), on the index kernels; across
    // ranks the latent rows move (and their gradients come back).
    CHECK(rep.figures.get("fwd_kernel_args").value_or(0) > 0);
    CHECK(rep.figures.get("fwd_cudnn_args").value_or(-1) == 0);
    int remote = 0;
    for (const RankPlan& rp : plan.ranks)
      for (const auto& st : rp.bwd.calc.remote_attn_args) remote += static_cast<int>(st.size());
    INFO("remote args (backward): ", remote);
    if (P > 1) CHECK(remote > 0);
  }
}
