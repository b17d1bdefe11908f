#pragma once
// The `balanced_bytes` solver: a portfolio of start placements (owner, usp,
// the seed's binary_greedy), each repaired to the balance cap and improved by a
// local search on the bytes that really move; the best one wins. Where no
// placement on the given grid meets the cap (a cell alone is too big), the
// shards are cut into more blocks and the search runs again on the finer grid.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cpsched/params.hpp>
#include <cpsched/solver.hpp>

namespace cpsched::bytes {

struct Options {
  double mu = 1.10;
  double fwd_weight = 1.0;
  double bwd_weight = 0.0;
  double bottleneck_weight = 0.0;
  std::int64_t effort = 400000;   // move evaluations per solve (up to 256 tasks)
  int threads = 1;
  int max_blocks_per_rank = 8;
  int usp_max_degree = 8;
  bool binary_greedy = true;
  std::int64_t binary_greedy_max_tasks = 4096;
  std::uint64_t seed = 1;
};

Options parse_options(const Params& p);

// One candidate placement and how it scores.
struct Candidate {
  std::string origin;            // which start it came from
  std::vector<Rank> rank;
  std::int64_t excess = 0;       // load above the cap, summed over ranks
  double objective = 0;
};

class BalancedBytes final : public Solver {
 public:
  explicit BalancedBytes(const Params& p) : opt_(parse_options(p)) {}
  explicit BalancedBytes(Options o) : opt_(o) {}
  Assignment solve(const SolveInput& in) override;

 private:
  // The best candidate on one grid, and every candidate it looked at.
  Candidate solve_grid(const SolveInput& in, std::vector<Candidate>& seen) const;
  Options opt_;
};

}  // namespace cpsched::bytes
