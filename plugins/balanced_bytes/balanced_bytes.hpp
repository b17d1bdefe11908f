#pragma once
// The `balanced_bytes` solver: a portfolio of start placements (owner, usp,
// the seed's binary_greedy), each repaired to the balance cap and improved by a
// local search on the bytes that really move; the best one wins. Where no
// placement on the given grid meets the cap (a cell alone is too big), the
// shards are cut into more blocks and the search runs again on the finer grid.
// The time mode does the same in the fixed layout across nodes, where finer
// blocks are the only way to split a long document's rows over ranks and
// stages: made ahead it solves the grids of 2 and 4 times the blocks too and
// keeps the fastest plan (the time mode's phases: planner.hpp).
#include <cstdint>
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

// Member solutions already made (time mode: the used-few-times path's, reused
// by the full search), by member name; nullopt where the member failed, with `why`.
struct SolvedMembers {
  std::map<std::string, std::optional<Solution>> got;
  std::map<std::string, std::string> why;
};

struct MemberResult {
  std::string name;
  Assignment assignment;
  const TaskGrid* input_grid = nullptr;  // the grid the member was given
};

// The members' placements, in the order of their names, and those that failed (with why).
struct MembersRun {
  std::vector<MemberResult> results;
  std::vector<std::string> skipped;
};

// The members' specs for this solve (binary_greedy's balance target by the
// nodes). member_tile: static's members cut documents at multiples of this
// many tokens (static's tile_tokens), 0: as static decides.
std::vector<std::string> member_names(const SolveInput& in, const Options& opt, Objective objective,
                                      std::int64_t member_tile);

// Every member of `names` solved on `in` (none above member_max_tasks); those
// in `solved` are not solved again.
MembersRun solve_members(const SolveInput& in, const Options& opt, MemberSolvers& members,
                         const std::vector<std::string>& names, SolvedMembers solved);

// How one grid is searched, beside the options: the objective (resolved),
// the balance cap and the effort.
struct GridSearch {
  Objective objective = Objective::bytes;
  double mu = 1.10;
  std::int64_t effort = 0;    // move evaluations per solve up to 256 tasks
  bool member_grid = false;   // a member's own grid (time mode): its placement priced as it is
};

// The options' own search of a grid under `objective`.
GridSearch grid_search(const Options& opt, Objective objective);

// Every candidate the search of `in`'s grid looks at: the starts (the
// portfolio's placements and the members' on this grid), each searched, and
// the best one searched further.
std::vector<Candidate> search_grid(const SolveInput& in, const Options& opt, const GridSearch& how,
                                  const std::vector<MemberResult>& members);

// The best of `cands` from `from` on (meeting the cap first, then less load
// above it, then a lower objective; the first of equals).
const Candidate& best_candidate(const std::vector<Candidate>& cands, std::size_t from = 0);

class BalancedBytes final : public Solver {
 public:
  explicit BalancedBytes(const Params& p);
  explicit BalancedBytes(Options o);
  ~BalancedBytes() override;
  Solution solve(const SolveInput& in) override;

 private:
  Solution solve_bytes(const SolveInput& in, Objective objective) const;
  // The time mode (time_mode.cpp); under a kernel model today's plan, then the
  // fastest under the kernel model of the plans priced (kernel_pick.hpp).
  Solution solve_time(const SolveInput& in) const;
  Options opt_;
  std::shared_ptr<MemberSolvers> members_;  // loaded once, for every solve
};

}  // namespace cpsched::search
