// Plan validator: entry-by-entry reference for small problems.
#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "cpsched/plan/validator.hpp"
#include "plan/validator/internal.hpp"

namespace cpsched {

std::vector<std::string> brute_force_plan_coverage(const Assignment& a, const Plan& plan, std::size_t max_problems) {
  using namespace validate_detail;
  const TaskGrid& grid = *a.grid;
  const Token S = grid.problem().seqlen();
  const auto G = static_cast<std::size_t>(grid.num_groups());
  if (static_cast<double>(G) * static_cast<double>(S) * static_cast<double>(S) > static_cast<double>(1 << 26))
    throw Error(fmt::format("brute_force_plan_coverage: {} groups x {}^2 entries is too large for a brute-force check",
                            G, S));
  std::vector<std::string> out;
  Problems pr(out, max_problems);
  const auto N = static_cast<std::size_t>(plan.num_stages);
  const auto SS = static_cast<std::size_t>(S);
  for (bool fwd : {true, false}) {
    std::vector<std::string> ignored;
    Problems quiet(ignored, 0);
    const std::vector<RankMaps> maps = check_comm(a, plan, fwd, quiet);
    std::vector<std::uint8_t> count(G * SS * SS, 0);
    for (std::size_t r = 0; r < plan.ranks.size() && r < maps.size(); ++r) {
      const PassPlan& pp = pass_of(plan.ranks[r], fwd);
      for (std::size_t s = 0; s <= N && s <= pp.calc.remote_attn_args.size(); ++s) {
        const auto& args = s == 0 ? pp.calc.local_attn_args : pp.calc.remote_attn_args[s - 1];
        for (const AttnArg& x : args) {
          const Slice as{x.q, x.k, x.type};
          const BufferMap& qm = x.q_buf == BufferId::local ? maps[r].local : maps[r].remote[0];
          const BufferMap& km = x.k_buf == BufferId::local ? maps[r].local : maps[r].remote[1];
          // Buffer row -> global token, entry by entry (rows outside the buffer are skipped).
          std::vector<Token> qg(static_cast<std::size_t>(x.q.size()), -1), kg(static_cast<std::size_t>(x.k.size()), -1);
          qm.walk(x.q, [&](Range b, Token g0, int) {
            for (Token i = b.begin; i < b.end; ++i) qg[static_cast<std::size_t>(i - x.q.begin)] = g0 + (i - b.begin);
          });
          km.walk(x.k, [&](Range b, Token g0, int) {
            for (Token j = b.begin; j < b.end; ++j) kg[static_cast<std::size_t>(j - x.k.begin)] = g0 + (j - b.begin);
          });
          const std::size_t gi = x.group < 0 ? 0 : static_cast<std::size_t>(x.group) % G;
          if (x.is_index()) {
            const auto w = static_cast<Token>(x.index_width);
            for (Token i = x.q.begin; i < x.q.end; ++i)
              for (Token j = 0; j < w; ++j) {
                const std::size_t at = static_cast<std::size_t>(x.index_offset + (i - x.q.begin) * w + j);
                if (at >= pp.calc.indices.size()) continue;
                const Token e = pp.calc.indices[at];
                if (e < x.k.begin || e >= x.k.end) continue;
                const Token q = qg[static_cast<std::size_t>(i - x.q.begin)], k = kg[static_cast<std::size_t>(e - x.k.begin)];
                if (q < 0 || k < 0) continue;
                std::uint8_t& c = count[(gi * SS + static_cast<std::size_t>(q)) * SS + static_cast<std::size_t>(k)];
                if (c < 255) ++c;
              }
            continue;
          }
          for (Token i = x.q.begin; i < x.q.end; ++i)
            for (Token j = x.k.begin; j < x.k.end; ++j) {
              if (!slice_contains(as, i, j)) continue;
              const Token q = qg[static_cast<std::size_t>(i - x.q.begin)], k = kg[static_cast<std::size_t>(j - x.k.begin)];
              if (q < 0 || k < 0) continue;
              std::uint8_t& c = count[(gi * SS + static_cast<std::size_t>(q)) * SS + static_cast<std::size_t>(k)];
              if (c < 255) ++c;
            }
        }
      }
    }
    for (std::size_t g = 0; g < G; ++g) {
      const std::vector<std::uint8_t> mask = dense_mask(grid.problem(), grid.flattened() ? static_cast<int>(g) : 0);
      for (std::size_t q = 0; q < SS; ++q)
        for (std::size_t k = 0; k < SS; ++k) {
          const int c = count[(g * SS + q) * SS + k], want = mask[q * SS + k];
          if (c != want)
            pr.add("{}: entry (q {}, k {}) of group {} is computed {} times, the mask wants {}", pass_name(fwd), q, k,
                   g, c, want);
        }
    }
  }
  pr.finish();
  return out;
}

}  // namespace cpsched
