#pragma once
// The `balanced_bytes` solver: a portfolio of start placements (owner, usp,
// the seed's binary_greedy), each repaired to the balance cap and improved by a
// local search on the bytes that really move; the best one wins. Where no
// placement on the given grid meets the cap (a cell alone is too big), the
// shards are cut into more blocks and the search runs again on the finer grid.
// The time mode does the same in the fixed layout across nodes, where finer
// blocks are the only way to split a long document's rows over ranks and
// stages: made ahead it solves the grids of 2 and 4 times the blocks too and
// keeps the fastest plan.
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <cpsched/plugin/params.hpp>
#include <cpsched/plugin/solver.hpp>

namespace cpsched::search {

// What the search minimises: `time` (predicted step time under a time cost
// model), `bytes` (weighted total bytes), `bottleneck` (the seed's: the
// busiest rank's send or receive, forward + backward); `auto` is `time` when
// the cost model prices time, else `bytes`.
enum class Objective { automatic, time, bytes, bottleneck };

struct Options {
  Objective objective = Objective::automatic;
  double spread = 0.25;           // time: weight of the mean rank time beside the max
  // Member solvers by spec, made through the host; members_by_layout (the
  // parameter's `auto`): binary_greedy, and in a planned layout also static
  // one- and two-level.
  std::vector<std::string> members;
  bool members_by_layout = true;
  // (Not a parameter.) static's members cut documents at multiples of this
  // many tokens (static's tile_tokens), 0: as static decides. Set used a few
  // times under a kernel model, where the members see the profile without it.
  std::int64_t member_tile = 0;
  double mu = 1.10;
  double fwd_weight = 1.0;
  double bwd_weight = 0.0;
  double bottleneck_weight = 0.0;
  std::int64_t effort = 400000;   // move evaluations per solve (up to 256 tasks)
  int threads = 1;
  int max_blocks_per_rank = 8;
  int usp_max_degree = 8;
  std::int64_t member_max_tasks = 131072;  // members run on grids of at most this many tasks
  double settle = 0.01;           // time: stop pricing within this fraction of the compute bound
  int priced_plans = 4;           // time: candidates priced as plans by the timing model (best predicted first)
  std::uint64_t seed = 1;
};

Options parse_options(const Params& p);

// One candidate placement and how it scores.
struct Candidate {
  std::string origin;            // which start it came from
  std::vector<Rank> rank;
  std::int64_t excess = 0;       // load above the cap, summed over ranks
  double objective = 0;
  std::shared_ptr<const TaskGrid> grid;  // the grid `rank` refers to
  bool searched = false;                 // improved by the local search (else a start as it is)
  // Time mode: the search's prediction of the step (seconds, the slowest
  // rank's time); it ranks the candidates before the timing model prices the
  // most promising ones as plans. Infinity where not predicted.
  double predicted_s = std::numeric_limits<double>::infinity();
};

// The same placement: the same grid and the same rank of every task.
inline bool same_placement(const Candidate& a, const Candidate& b) {
  return a.grid.get() == b.grid.get() && a.rank == b.rank;
}

class MemberSolvers;

// Member solutions already made (time mode: the quick path's, reused by the
// full search), by member name; nullopt where the member failed, with `why`.
struct SolvedMembers {
  std::map<std::string, std::optional<Solution>> got;
  std::map<std::string, std::string> why;
};

struct MemberResult {
  std::string name;
  Assignment assignment;
  const TaskGrid* input_grid = nullptr;  // the grid the member was given
};

class BalancedBytes final : public Solver {
 public:
  explicit BalancedBytes(const Params& p);
  explicit BalancedBytes(Options o);
  BalancedBytes(const BalancedBytes&) = default;
  ~BalancedBytes() override;
  Solution solve(const SolveInput& in) override;

 private:
  // The best candidate on one grid, and every candidate it looked at.
  // member_grid: the grid of a member that dispatches tokens (time mode).
  Candidate solve_grid(const SolveInput& in, std::vector<Candidate>& seen, const std::vector<MemberResult>& members,
                       bool member_grid = false) const;
  // Every member's result, in member_names' order; those in `solved` are not solved again.
  std::vector<MemberResult> solve_members(const SolveInput& in, std::vector<std::string>& skipped,
                                          SolvedMembers solved = {}) const;
  // The members' specs for this solve (binary_greedy's balance target by the nodes).
  std::vector<std::string> member_names(const SolveInput& in) const;
  Solution solve_bytes(const SolveInput& in) const;
  // The time mode; under a kernel model today's plan, then the fastest under
  // the kernel model of the plans priced (kernel_pick.hpp).
  Solution solve_time(const SolveInput& in) const;
  // The time mode on `in`'s prices as they are.
  Solution solve_time_on(const SolveInput& in) const;
  // The full time-mode solve on the input grid (members, searches, pricing).
  Solution solve_time_full(const SolveInput& in, SolvedMembers solved) const;
  // After a full solve (sol, priced and not settled): the full solve repeated
  // as `solve` where that pays (effort.hpp: (1 / uses) x cost < gain x the gap
  // left), the faster plan kept in sol; `tried` notes it as `what`. False
  // where it did not run.
  bool repeat_solve(const SolveInput& in, Solution& sol, double cost, double gain, const std::string& what,
                    std::string& tried, const std::function<Solution()>& solve) const;
  // On one node: the full solve under a balance cap of 1.03 (NVLink makes a
  // tighter balance cheap there).
  void try_tighter_cap(const SolveInput& in, Solution& sol, std::string& tried) const;
  // The full solve under that cap, feasible against mu.
  Solution solve_time_tight(const SolveInput& in) const;
  // The fixed layout: the full solve on grids of 2 and 4 times the blocks per
  // rank (on one node under the tighter cap).
  void try_finer_grids(const SolveInput& in, Solution& sol, std::string& tried) const;
  // The time mode used a few times (uses >= 1): the starts, and the phases
  // that pay for their weighted planning time (effort.hpp); nullopt where the
  // full search pays (and always when made ahead).
  // `solved`: the members it ran, for the full search.
  std::optional<Solution> solve_time_quick(const SolveInput& in, SolvedMembers& solved) const;
  // The same on a grid above member_max_tasks (quick_huge.cpp): the starts
  // and the best one balanced row by row, by prediction alone.
  Solution solve_time_huge(const SolveInput& in) const;
  // solve_time's steps: the bytes objective's candidate, and the searches on
  // the grids of members that dispatch tokens.
  Candidate bytes_mode_candidate(const SolveInput& in, const std::vector<MemberResult>& members) const;
  void search_member_grids(const SolveInput& in, const std::vector<MemberResult>& members,
                           std::vector<Candidate>& seen) const;
  // The same solver with another objective (auto resolved; the bytes candidate).
  BalancedBytes with_objective(Objective o) const;
  Options opt_;
  std::shared_ptr<MemberSolvers> members_;  // loaded once, shared by with_objective's copies
};

}  // namespace cpsched::search
