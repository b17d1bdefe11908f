// Solver plugin `ilp`: the exact placement model (ilp_model.hpp) solved with
// GLPK under one time limit. The yardstick of the other solvers at small P:
// its figures report the incumbent, the proven bound and the gap.
//
// With flattened head groups it first solves the aggregated model (no group
// symmetry, far fewer integers): its optimum is a lower bound, and its counts,
// realised as a per-group placement, usually meet that bound, which proves
// them optimal. Otherwise the per-group model runs for the remaining time,
// starting from the best placement so far; the bound reported is the larger of
// the two models' bounds.
//
// Figures (what `cpsched compare` and bench_vs_ilp read): total_objective
// (1: the bytes are the forward total send, 0: the bottleneck), and when a
// placement met the balance cap incumbent_bytes, bound_bytes, gap_pct and
// proven (1: optimal). The note says the same for people, with each model's
// run and the time spent.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>

#include <cpsched/base/error.hpp>
#include <cpsched/plugin/plugin.hpp>
#include <cpsched/plugin/solver.hpp>

#include "cpsched/search/byte_model.hpp"
#include <glpk.h>

#include "glpk_run.hpp"
#include "ilp_model.hpp"
#include "cpsched/search/placements.hpp"
#include "realize.hpp"
#include "cpsched/search/search.hpp"
#include "cpsched/search/state.hpp"

namespace cpsched::ilp {

namespace {

std::string num(double v, const char* fmt = "%.6g") {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string size_text(const IlpModel& m) {
  const ModelSize& s = m.size();
  return std::to_string(s.integers) + " integers, " + std::to_string(s.columns) + " columns, " +
         std::to_string(s.rows) + " rows";
}

std::string run_text(const RunResult& r) {
  if (!r.ok || !r.lp_solved || r.infeasible) return r.error;
  std::string t = r.optimal ? "solved" : (r.time_limit_hit ? "time limit" : "stopped");
  if (r.has_incumbent) t += ", incumbent " + num(r.incumbent * IlpModel::kUnit, "%.0f") + " B";
  t += ", bound " + num(r.bound * IlpModel::kUnit, "%.0f") + " B, " + num(r.seconds, "%.2f") + " s";
  return t;
}

// The best placement known so far and where it came from.
struct Incumbent {
  std::vector<Rank> rank;
  double bytes = 0;
  std::string origin;
  bool valid() const { return !rank.empty(); }
  void offer(std::vector<Rank> r, double b, const std::string& from) {
    if (!valid() || b < bytes - 1e-6) {
      rank = std::move(r);
      bytes = b;
      origin = from;
    }
  }
};

class IlpSolver final : public Solver {
 public:
  explicit IlpSolver(const Params& p)
      : mu_(p.get_real("mu")),
        time_limit_s_(p.get_real("time_limit_s")),
        mip_gap_(p.get_real("mip_gap")),
        warm_start_(p.get_bool("warm_start")),
        aggregate_(p.get_bool("aggregate")) {
    const std::string& obj = p.get_string("objective");
    if (obj == "total") {
      objective_ = Objective::total;
    } else if (obj == "bottleneck") {
      objective_ = Objective::bottleneck;
    } else {
      throw Error("ilp: objective = '" + obj + "' is not one of: total, bottleneck");
    }
    if (!(mu_ >= 1.0)) throw Error("ilp: mu = " + num(mu_) + " must be >= 1 (max load <= mu x mean)");
    if (!(time_limit_s_ > 0.0)) throw Error("ilp: time_limit_s = " + num(time_limit_s_) + " must be > 0");
    if (!(mip_gap_ >= 0.0 && mip_gap_ < 1.0)) throw Error("ilp: mip_gap = " + num(mip_gap_) + " must be in [0, 1)");
  }

  Solution solve(const SolveInput& in) override {
    if (!in.grid()) throw Error("ilp: no task grid given");
    // GLPK keeps its environment (hooks, and in some builds every object) in
    // process state: one solve at a time in a process.
    static std::mutex glpk_mutex;
    std::lock_guard<std::mutex> lock(glpk_mutex);
    // Declared before the models, so it runs after they are deleted: frees
    // GLPK's environment, which otherwise outlives the plugin (a leak per process).
    struct FreeGlpkEnv {
      ~FreeGlpkEnv() { glp_free_env(); }
    } free_env;
    const auto start = std::chrono::steady_clock::now();
    // One deadline for every step: the start placements are bounded by effort,
    // every GLPK run (relaxation and search, each model) by this clock.
    const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                      std::chrono::duration<double>(time_limit_s_));
    auto left_s = [&] {
      return time_limit_s_ - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    const TaskGrid& grid = *in.grid();
    const search::ByteModel model(grid, 1.0, 0.0);  // forward bytes
    // A rank can carry at most all the load, mu x mean = load x mu / P: any mu
    // >= P allows every placement. Clamped so that mu x total / P stays a
    // number of the load's size (mu = 1e20 overflowed the cap).
    const std::int64_t cap = search::balance_cap(grid, std::min(mu_, static_cast<double>(grid.cp_size())));
    const double bottleneck_weight = objective_ == Objective::bottleneck ? 1e3 : 0.0;  // State objective ~ bottleneck first
    const double unit = IlpModel::kUnit;

    Incumbent inc;
    std::vector<Rank> fallback;  // returned when nothing meets the cap
    if (warm_start_) start_placements(model, cap, bottleneck_weight, inc, fallback);
    double bound = 0.0;
    bool proven_infeasible = false;
    std::string notes;

    // (The aggregated model counts interchangeable groups: not per-group cells.)
    if (aggregate_ && grid.flattened() && model.groups() > 1 && !grid.per_group_cells() && left_s() > 0) {
      IlpModel agg(model, cap, objective_, Form::aggregated);
      RunOptions ro;
      ro.deadline = deadline;
      ro.share = 0.7;
      ro.mip_gap = mip_gap_;
      std::vector<double> warm;
      if (inc.valid()) {
        warm = agg.columns_of(inc.rank);
        ro.warm = &warm;
      }
      const RunResult r = run_glpk(agg.problem(), ro);
      if (!r.ok) agg.forget_problem();
      notes += "; aggregated model (" + size_text(agg) + "): " + run_text(r);
      proven_infeasible = proven_infeasible || r.infeasible;  // a relaxation: none for the exact model either
      if (r.lp_solved) bound = std::max(bound, r.bound * unit);
      if (r.has_incumbent) {
        const std::vector<int> counts = agg.counts_of(r.cols);
        std::vector<Rank> p = realize(model, counts, 8, bottleneck_weight);
        const double b = objective_bytes(model, objective_, p);
        inc.offer(std::move(p), b, "aggregated model, realised");
        if (inc.bytes > bound + 1e-6 * inc.bytes && left_s() > 0) {
          IlpModel fixed(model, cap, objective_, Form::per_group, &counts);
          RunOptions fo;
          fo.deadline = deadline;
          fo.share = 0.5;
          std::vector<double> w = fixed.columns_of(fixed.canonical(inc.rank));
          fo.warm = &w;
          const RunResult f = run_glpk(fixed.problem(), fo);
          if (!f.ok) fixed.forget_problem();
          notes += "; realisation model: " + run_text(f);
          if (f.has_incumbent) {
            std::vector<Rank> q = fixed.placement_of(f.cols);
            const double qb = objective_bytes(model, objective_, q);
            inc.offer(std::move(q), qb, "aggregated model, realised exactly");
          }
        }
      }
    }
    const bool proven_by_aggregate = inc.valid() && inc.bytes <= bound + 1e-6 * inc.bytes;
    if (!proven_by_aggregate && !proven_infeasible && left_s() > 0) {
      IlpModel ex(model, cap, objective_, Form::per_group);
      RunOptions ro;
      ro.deadline = deadline;
      ro.mip_gap = mip_gap_;
      std::vector<double> warm;
      if (inc.valid()) {
        warm = ex.columns_of(ex.canonical(inc.rank));
        ro.warm = &warm;
      }
      const RunResult r = run_glpk(ex.problem(), ro);
      if (!r.ok) ex.forget_problem();
      proven_infeasible = proven_infeasible || r.infeasible;
      notes += "; per-group model (" + size_text(ex) +
               (ex.symmetry_cells().empty()
                    ? std::string()
                    : ", groups ordered on " + std::to_string(ex.symmetry_cells().size()) + " cells") +
               "): " + run_text(r);
      if (r.lp_solved) bound = std::max(bound, r.bound * unit);
      if (r.has_incumbent) {
        std::vector<Rank> p = ex.placement_of(r.cols);
        const double b = objective_bytes(model, objective_, p);
        inc.offer(std::move(p), b, "per-group model");
      }
    }

    Solution sol;
    Assignment& a = sol.assignment;
    a.grid = in.grid();
    sol.figures.set("total_objective", objective_ == Objective::total ? 1 : 0);
    const std::string what = std::string("ilp (") + (objective_ == Objective::total ? "total" : "bottleneck") +
                             " forward bytes, mu " + num(mu_) + "): ";
    if (inc.valid()) {
      a.rank = inc.rank;
      bound = std::min(bound, inc.bytes);
      const double gap = inc.bytes > 0 ? (inc.bytes - bound) / inc.bytes : 0.0;
      const bool optimal = gap <= 1e-6;
      sol.note = what + (optimal ? "optimal" : "not proven optimal") + "; incumbent " + num(inc.bytes, "%.0f") +
                 " B (" + inc.origin + "), bound " + num(bound, "%.0f") + " B, gap " + num(100.0 * gap, "%.4f") + " %";
      sol.figures.set("incumbent_bytes", inc.bytes);
      sol.figures.set("bound_bytes", bound);
      sol.figures.set("gap_pct", 100.0 * gap);
      sol.figures.set("proven", optimal ? 1 : 0);
    } else {
      // No placement meets the cap: the least overloaded start we have.
      a.rank = fallback.empty() ? search::owner_placement(grid) : fallback;
      sol.feasible = false;
      sol.note = what + (proven_infeasible ? "no placement meets the balance cap (proven)"
                                         : "no placement meeting the balance cap was found in " +
                                               num(time_limit_s_) + " s");
    }
    sol.note += notes + "; " + num(time_limit_s_ - left_s(), "%.2f") + " s in all";
    return sol;
  }

 private:
  // Owner and usp, each moved under the cap by the greedy repair and a
  // descent on this objective: the first incumbent.
  void start_placements(const search::ByteModel& model, std::int64_t cap, double bottleneck_weight, Incumbent& inc,
                        std::vector<Rank>& fallback) const {
    std::vector<std::pair<std::string, std::vector<Rank>>> starts;
    starts.emplace_back("owner", search::owner_placement(model.grid()));
    if (model.grid().flattened()) starts.emplace_back("usp", search::usp_placement(model.grid(), 8));
    std::int64_t least_excess = -1;
    for (auto& [name, rank] : starts) {
      search::State st(model, rank, cap, bottleneck_weight);
      search::Budget budget{200000};
      search::repair(st, budget);
      search::descend(st, budget);
      if (st.excess() == 0) inc.offer(st.placement(), objective_bytes(model, objective_, st.placement()),
                                      name + " start, repaired");
      if (least_excess < 0 || st.excess() < least_excess) {
        least_excess = st.excess();
        fallback = st.placement();
      }
    }
  }

  double mu_;
  double time_limit_s_;
  double mip_gap_;
  bool warm_start_;
  bool aggregate_;
  Objective objective_ = Objective::total;
};

const cpsched_param_spec kParams[] = {
    {"mu", CPSCHED_PARAM_REAL, "1.10", "balance target: max load <= mu x mean"},
    {"objective", CPSCHED_PARAM_STRING, "total",
     "total: forward bytes summed over ranks; bottleneck: max over ranks of forward send and recv"},
    {"time_limit_s", CPSCHED_PARAM_REAL, "30", "wall-clock limit of the whole solve (all GLPK runs)"},
    {"mip_gap", CPSCHED_PARAM_REAL, "0.0", "stop a GLPK run when (incumbent - bound) / incumbent <= mip_gap"},
    {"warm_start", CPSCHED_PARAM_BOOL, "true",
     "offer GLPK the better of owner and usp (repaired to mu, descended) as its first incumbent"},
    {"aggregate", CPSCHED_PARAM_BOOL, "true",
     "with flattened head groups, solve the aggregated model (group counts per cell) first: its optimum is a "
     "lower bound, proven tight when its realisation meets it"},
};

}  // namespace

}  // namespace cpsched::ilp

CPSCHED_SOLVER_PLUGIN(cpsched::ilp::IlpSolver, "ilp",
                      "exact MILP (GLPK) of token-granular forward bytes under the balance cap: the yardstick "
                      "for small P; reports incumbent, proven bound and gap",
                      cpsched::ilp::kParams)
