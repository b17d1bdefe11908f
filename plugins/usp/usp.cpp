// Solver plugin `usp`: the Ulysses x ring baseline (docs/design.md#metrics, docs/design.md#solvers) expressed
// as an assignment on the task grid.
//
// Ulysses degree u = usp_ulysses_degree(P, hkv, max_degree), ring degree P/u.
// Ranks form P/u Ulysses groups of u consecutive ranks; inside a group each
// rank takes G/u of the G head groups for every q block hosted in the group,
// and (ring) every kv block. So task (q block i, head group g) runs on rank
//   (host(i) / u) * u + g * u / G.
// Ulysses splits heads, so the grid must have flattened head groups.
#include <algorithm>
#include <string>

#include <cpsched/base/error.hpp>
#include <cpsched/problem/metrics.hpp>
#include <cpsched/plugin/plugin.hpp>
#include <cpsched/plugin/solver.hpp>

namespace {

using namespace cpsched;

class Usp final : public Solver {
 public:
  explicit Usp(const Params& p) : max_degree_(p.get_int("max_degree")) {
    if (max_degree_ < 1)
      throw Error("usp: max_degree = " + std::to_string(max_degree_) + " must be >= 1");
  }

  Solution solve(const SolveInput& in) override {
    if (!in.grid()) throw Error("usp: no task grid given");
    const TaskGrid& grid = *in.grid();
    const Problem& p = grid.problem();
    if (!grid.flattened())
      throw Error("usp: Ulysses splits attention heads, so it needs flattened head groups; set "
                  "problem.grid.flatten_head_groups: true");
    const int P = grid.cp_size();
    const int G = grid.num_groups();
    const int u = usp_ulysses_degree(P, p.heads.kv, static_cast<int>(std::min<std::int64_t>(max_degree_, 1 << 20)));
    Solution sol;
    Assignment& a = sol.assignment;
    a.grid = in.grid();
    a.rank.resize(static_cast<std::size_t>(grid.num_tasks()));
    for (TaskId t = 0; t < grid.num_tasks(); ++t) {
      const Rank host = grid.q_host(t);
      const int g = grid.group_of(t);
      a.rank[static_cast<std::size_t>(t)] = (host / u) * u + g * u / G;
    }
    sol.note = "usp: Ulysses degree " + std::to_string(u) + ", ring degree " + std::to_string(P / u);
    sol.figures.set("ulysses_degree", u);
    sol.figures.set("ring_degree", P / u);
    if (G % u != 0)
      sol.note += "; " + std::to_string(G) + " head groups do not split evenly over " + std::to_string(u) +
                " Ulysses ranks, so the closed form does not apply";
    return sol;
  }

 private:
  std::int64_t max_degree_;
};

const cpsched_param_spec kParams[] = {
    {"max_degree", CPSCHED_PARAM_INT, "8",
     "largest Ulysses degree (GPUs of one node); u = largest divisor of P at most min(max_degree, hkv)"},
};

}  // namespace

CPSCHED_SOLVER_PLUGIN(Usp, "usp",
                      "Ulysses x ring (USP) baseline: heads split inside groups of u ranks, ring across groups",
                      kParams)
