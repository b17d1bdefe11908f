#include "compare/sweep.hpp"

#include <algorithm>
#include <chrono>
#include <fmt/format.h>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "compare/ilp.hpp"
#include "compare/progress.hpp"
#include "compare/timing.hpp"
#include "cpsched/base/stopwatch.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/io/atomic_file.hpp"
#include "cpsched/io/plan_json.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/session/solve_path.hpp"
#include "cpsched/timing/model.hpp"
#include "commands/report.hpp"

namespace cpsched::cli {

std::optional<double> step_over_bound(const CompareFigures& f) {
  if (!f.fwd_step_ms || !f.bwd_step_ms || !f.compute_bound_ms || *f.compute_bound_ms <= 0) return std::nullopt;
  return (*f.fwd_step_ms + *f.bwd_step_ms) / *f.compute_bound_ms;
}

std::optional<double> cost_per_use(const CompareRow& r) {
  const std::optional<double> ratio = step_over_bound(r.f);
  if (!ratio) return std::nullopt;
  if (r.uses.is_ahead()) return ratio;
  const double path = r.f.rank_path_ms ? *r.f.rank_path_ms : r.f.latency_ms;
  return *ratio + path / r.uses.uses / *r.f.compute_bound_ms;
}

std::optional<double> reduction_pct(double value, std::optional<double> baseline) {
  if (!baseline || *baseline <= 0) return std::nullopt;
  return 100.0 * (1.0 - value / *baseline);
}

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One profile of the hardware axis and its timing executor.
struct HwSlot {
  std::string name;                          // as given; empty: no hardware axis
  std::string spec;                          // for the plugins' `hardware` parameter
  const HardwareProfile* profile = nullptr;  // null: no hardware axis
  std::unique_ptr<TimingRunner> timing;      // null: timing off or its executor missing
};

// The solvers see one cost model per group and solve once per group; every
// profile of the group times the same plans. One group holding every profile
// unless the cost model takes `hardware`, then one group per profile.
struct CostGroup {
  std::unique_ptr<CostModel> cost;
  std::vector<const HwSlot*> slots;
};

// A solver made once for the whole sweep, with the parameter block the config
// gives it; a setup failure is kept and reported on every row of the solver.
struct SolverHandle {
  std::string name;
  const Registry* registry = nullptr;  // serves the solver's members
  std::unique_ptr<Solver> solver;
  std::string setup_error;
  int repeats = 1;
};

SolverHandle make_handle(const std::string& name, const Registry& reg, const ConfigLoader& load,
                         const CompareSpec& spec) {
  SolverHandle h;
  h.name = name;
  h.registry = &reg;
  h.repeats = spec.repeats;
  try {
    const Config c = load({"solver.name=" + name});
    const Params p = resolve_selection(reg, static_cast<int>(PluginKind::solver), c.solver);
    h.repeats = solver_repeats(spec, name, p);
    h.solver = reg.make_solver(name, p);
  } catch (const Error& e) {
    h.setup_error = e.what();
  }
  return h;
}

// The problem of one sweep point: the config's problem with the mask kind, P,
// heads, pack and layout replaced.
std::shared_ptr<const Problem> make_point_problem(const Config& cfg, MaskKind kind, int cp_size,
                                                  const HeadConfig& h, int pack, Layout layout) {
  Config c = cfg;
  c.layout = layout;
  c.cp_size = cp_size;
  c.heads.q = h.q;
  c.heads.kv = h.kv;
  c.heads.dim = h.dim;
  c.mask.kind = kind;
  c.mask.pack = pack;
  return std::make_shared<const Problem>(make_problem(c));
}

// The rows of one solver at one point: for each profile of `slots`, one per stage count.
std::vector<CompareRow> point_rows(const CompareRow& base, const std::string& solver,
                                   const std::vector<const HwSlot*>& slots, const std::vector<int>& stages) {
  std::vector<CompareRow> rows;
  for (const HwSlot* hw : slots)
    for (int st : stages) {
      CompareRow r = base;
      r.solver = solver;
      r.hardware = hw->name;
      r.stages = st;
      rows.push_back(std::move(r));
    }
  return rows;
}

// Per stage count: grid + solve + the slowest rank's own plan (each rank
// computes the transfers and builds only its CalcMeta and CommMeta,
// PlanOptions::rank), each rank's the median of `repeats` builds: the
// slowest of P single timings is mostly the machine's worst moment.
std::vector<std::optional<double>> rank_path_ms(const Assignment& a, const PlanShape& solved,
                                                const std::vector<int>& stages, const HardwareProfile* hardware,
                                                double grid_and_solve_ms, int repeats) {
  std::vector<std::optional<double>> out;
  for (int st : stages) {
    PlanOptions o{st == PlanShape::kAutoStages ? solved.stages : st, solved.relay_node_size()};
    o.hardware = hardware;  // the solve path's (SolvePath::run)
    o.timer = &timing_model_timer();
    // The cut the solve resolved, as a rank's own solve path has it (its
    // solve priced the cut, or the solver named it).
    if (hardware != nullptr && o.stages == solved.stages) o.stage_cut = solved.cut;
    double slowest = 0;
    for (Rank r = 0; r < a.grid->cp_size(); ++r) {
      o.rank = r;
      std::vector<double> times;
      for (int rep = 0; rep < std::max(repeats, 1); ++rep) {
        const auto t0 = Clock::now();
        const Plan p = PlanBuilder(a).build(o);  // what the rank computes alone: its transfers too
        times.push_back(ms_since(t0));
      }
      slowest = std::max(slowest, median(std::move(times)));
    }
    out.push_back(grid_and_solve_ms + slowest);
  }
  return out;
}

// `compare --plans DIR`: one file per solved plan, named by its cell. The
// solve's time is left out (0) so that equal plans give equal bytes.
void write_plans(const std::string& dir, const CompareRow& base, const std::string& solver,
                 const std::vector<int>& stages, const std::vector<std::shared_ptr<const Plan>>& plans,
                 const SolveResult& result) {
  for (std::size_t s = 0; s < plans.size(); ++s) {
    PlanExport e;
    e.assignment = result.assignment.get();
    e.metrics = &result.metrics;
    e.plan = plans[s].get();
    e.solver = solver;
    e.solve_ms = 0;
    e.feasible = result.feasible;
    e.note = result.note;
    const std::string name =
        fmt::format("{}_P{}_pack{}_{}x{}_{}_{}_{}_s{}.json", base.mask, base.cp_size, base.pack, base.heads.q,
                    base.heads.kv, to_string(base.layout), base.asked_uses ? base.asked_uses->str() : "default", solver,
                    stages[s]);
    write_file_atomic(std::filesystem::path(dir) / name, plan_json(e) + "\n");
  }
}

// One solver on one problem: `h.repeats` runs of the whole path (grid, solve,
// plan for each stage count), metrics of the last, timing of each plan on
// every profile of `slots`. Rows: [profile][stage count].
std::vector<CompareRow> run_solver(const SolverHandle& h, const std::shared_ptr<const Problem>& problem,
                                   const CostModel& cost, const CompareSpec& spec,
                                   const std::vector<const HwSlot*>& slots, const CompareRow& base) {
  std::vector<CompareRow> rows = point_rows(base, h.name, slots, spec.stages);
  auto fail_all = [&](const std::string& msg) {
    for (auto& r : rows) {
      r.ok = false;
      r.error = msg;
    }
    return rows;
  };
  if (!h.solver) return fail_all(h.setup_error);
  if (const auto lim = spec.max_cp_size.find(h.name);
      lim != spec.max_cp_size.end() && problem->cp_size() > lim->second) {
    for (auto& r : rows) r.skipped = true;
    return fail_all(fmt::format("skipped: P = {} is above compare.max_cp_size.{} = {}", problem->cp_size(), h.name,
                                lim->second));
  }

  const std::size_t ns = spec.stages.size();
  // Relays need the node size: the cost model's profile, else the first of the
  // group's (the profiles of one group plan alike).
  int node = 0;
  if (const HardwareProfile* hw = cost.hardware()) node = hw->gpus_per_node;
  else if (!slots.empty() && slots.front()->profile != nullptr) node = slots.front()->profile->gpus_per_node;
  // One solve serves every stage count; a solver that prices plans is told
  // the count when there is one (auto: the solver chooses).
  PlanShape shape;
  shape.stages = ns == 1 ? spec.stages[0] : 1;
  shape.relay = node >= 2 ? spec.relay : PlanShape::Relay::off;
  shape.node_size = node >= 2 ? node : 0;
  std::vector<double> grid_ms, solve_ms;
  std::vector<std::vector<double>> plan_ms(ns), total_ms(ns);
  SolveResult result;
  std::vector<std::shared_ptr<const Plan>> plans(ns);
  try {
    const SolvePath path(*h.solver, cost, *h.registry);
    for (int rep = 0; rep < h.repeats; ++rep) {
      result = path.run(problem, {.shape = shape, .uses = base.asked_uses, .rank = -1, .solver_name = h.name});
      grid_ms.push_back(result.grid_ms);
      solve_ms.push_back(result.solve_ms);
      for (std::size_t s = 0; s < ns; ++s) {
        PlanShape at = shape;
        at.stages = spec.stages[s];
        if (at.resolve(result.shape) == result.shape) {
          plans[s] = result.plan;
          plan_ms[s].push_back(result.plan_ms);
        } else {
          const auto t0 = Clock::now();
          plans[s] = path.replan(result, at);
          plan_ms[s].push_back(ms_since(t0));
        }
        total_ms[s].push_back(grid_ms.back() + solve_ms.back() + plan_ms[s].back());
      }
    }
  } catch (const PluginError& e) {
    // A solver that must re-lay out the tokens (static) refuses the fixed layout: not run, by design.
    if (problem->layout == Layout::fixed) {
      for (auto& r : rows) r.skipped = true;
    }
    return fail_all(e.what());
  } catch (const Error& e) {
    return fail_all(e.what());
  }
  if (!spec.plans_dir.empty()) write_plans(spec.plans_dir, base, h.name, spec.stages, plans, result);
  const std::vector<std::optional<double>> rank_path = spec.rank_path
                                                           ? rank_path_ms(*result.assignment, result.shape, spec.stages, cost.hardware(),
                                                                          median(grid_ms) + median(solve_ms), h.repeats)
                                                           : std::vector<std::optional<double>>(ns);

  const Assignment& a = *result.assignment;
  const Metrics& m = result.metrics;
  const Problem& p = *problem;
  const int u = usp_ulysses_degree(p.cp_size(), p.heads.kv);
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const std::size_t s = k % ns;
    const HwSlot& hw = *slots[k / ns];
    CompareRow& row = rows[k];
    CompareFigures& f = row.f;
    f.fwd_send = static_cast<double>(m.fwd.total_send);
    f.fwd_bottleneck = static_cast<double>(m.fwd.bottleneck);
    f.bwd_send = static_cast<double>(m.bwd.total_send);
    f.bwd_bottleneck = static_cast<double>(m.bwd.bottleneck);
    f.usp_closed_fwd = usp_closed_form_fwd_bytes_per_rank(p, u) * p.cp_size();
    f.imbalance = m.imbalance;
    f.stage0_share = m.stage0_share;
    f.feasible_packs = result.feasible ? 1 : 0;
    f.grid_ms = median(grid_ms);
    f.solve_ms = median(solve_ms);
    f.plan_ms = median(plan_ms[s]);
    f.latency_ms = median(total_ms[s]);
    f.rank_path_ms = rank_path[s];
    row.uses = result.uses;
    row.solver_note = result.note;
    row.note = result.feasible ? "" : "balance target not met";  // (why: the solver's note, beside)
    if (h.name == kIlpSolver && result.feasible) {
      if (const auto n = ilp_figures(result.figures); n && n->total_objective) {
        f.ilp_bound = n->bound_bytes;
        f.ilp_proven_packs = n->proven ? 1 : 0;
        if (!n->proven)
          row.note = fmt::format("not proven optimal: bound {:.3f} GiB, gap {:.2f} %", gib(n->bound_bytes),
                                 n->incumbent_bytes > 0 ? 100.0 * (1.0 - n->bound_bytes / n->incumbent_bytes) : 0.0);
      } else {
        row.note = "bound unknown (the ilp's objective is not `total`): " + result.note;
      }
    }
    if (hw.profile != nullptr) {
      try {
        f.compute_bound_ms = 1e3 * compute_bound(p, *plans[s], *hw.profile);
      } catch (const Error& e) {
        row.note += (row.note.empty() ? "" : "; ") + ("compute bound: " + std::string(e.what()));
      }
    }
    if (hw.timing != nullptr) {
      std::string why;
      if (!hw.timing->measure(problem, a, *plans[s], f, why))
        row.note += (row.note.empty() ? "" : "; ") + ("timing: " + why);
    }
  }
  return rows;
}

// The reference placement's volumes, when the reference is not among the
// compared solvers (otherwise its own rows give them).
std::optional<std::pair<double, double>> reference_volumes(const SolverHandle& h,
                                                           const std::shared_ptr<const Problem>& problem,
                                                           const CostModel& cost, std::string& why) {
  if (!h.solver) {
    why = h.setup_error;
    return std::nullopt;
  }
  try {
    const SolveResult r = SolvePath(*h.solver, cost, *h.registry).run(problem, {.shape = PlanShape{}, .uses = std::nullopt, .validate = false, .rank = -1, .solver_name = h.name});
    const Metrics& m = r.metrics;
    return std::make_pair(static_cast<double>(m.fwd.total_send), static_cast<double>(m.bwd.total_send));
  } catch (const Error& e) {
    why = e.what();
    return std::nullopt;
  }
}

std::string point_label(const CompareRow& r) {
  std::string s = fmt::format("{} P={}", r.mask, r.cp_size);
  if (r.pack >= 0) s += fmt::format(" pack {}", r.pack);
  return s + fmt::format(" {}:{}", r.heads.q, r.heads.kv);
}

// Mean over packs (largest imbalance); a failure on any pack fails the row.
// The ilp columns are ratios of means: the mean of ilp's sends over the packs.
CompareRow aggregate(const std::vector<const CompareRow*>& group) {
  CompareRow out = *group.front();
  out.aggregate = true;
  out.pack = -1;
  out.packs = static_cast<int>(group.size());
  out.note.clear();
  out.solver_note.clear();  // (one per pack)
  CompareFigures& f = out.f;
  f = CompareFigures{};
  int failed = 0, skipped = 0;
  std::string first_error, notes;
  for (const CompareRow* r : group) {
    if (!r->ok) {
      if (failed++ == 0) first_error = r->error;
      skipped += r->skipped ? 1 : 0;
    }
    if (!r->note.empty() && notes.empty()) notes = r->note;
  }
  if (skipped == static_cast<int>(group.size())) {
    out.ok = false;
    out.skipped = true;
    out.error = first_error;
    return out;
  }
  if (failed > 0) {
    out.ok = false;
    out.skipped = false;
    out.error = group.size() == 1 ? first_error
                                  : fmt::format("failed on {} of {} packs; first: {}", failed, group.size(), first_error);
    return out;
  }
  const double n = static_cast<double>(group.size());
  bool have_ref = true, have_time = true, have_ilp = true, have_bound = true, have_cb = true;
  for (const CompareRow* r : group) {
    const CompareFigures& g = r->f;
    f.fwd_send += g.fwd_send / n;
    f.fwd_bottleneck += g.fwd_bottleneck / n;
    f.bwd_send += g.bwd_send / n;
    f.bwd_bottleneck += g.bwd_bottleneck / n;
    f.usp_closed_fwd += g.usp_closed_fwd / n;
    f.imbalance = std::max(f.imbalance, g.imbalance);
    f.stage0_share += g.stage0_share / n;
    f.feasible_packs += g.feasible_packs;
    f.latency_ms += g.latency_ms / n;
    f.grid_ms += g.grid_ms / n;
    f.solve_ms += g.solve_ms / n;
    f.plan_ms += g.plan_ms / n;
    have_ref = have_ref && g.ref_fwd && g.ref_bwd;
    have_ilp = have_ilp && g.ilp_fwd;
    have_bound = have_bound && g.ilp_bound && g.ilp_proven_packs;
    have_cb = have_cb && g.compute_bound_ms;
    have_time = have_time && g.fwd_step_ms && g.bwd_step_ms && g.fwd_exposed_ms && g.bwd_exposed_ms;
  }
  auto mean_of = [&](std::optional<double> CompareFigures::*field) {
    double s = 0;
    for (const CompareRow* r : group) s += *(r->f.*field) / n;
    return s;
  };
  if (have_ref) {
    f.ref_fwd = mean_of(&CompareFigures::ref_fwd);
    f.ref_bwd = mean_of(&CompareFigures::ref_bwd);
  }
  if (have_ilp) f.ilp_fwd = mean_of(&CompareFigures::ilp_fwd);
  if (have_bound) {
    f.ilp_bound = mean_of(&CompareFigures::ilp_bound);
    int proven = 0;
    for (const CompareRow* r : group) proven += *r->f.ilp_proven_packs;
    f.ilp_proven_packs = proven;
  }
  if (have_time) {
    f.fwd_step_ms = mean_of(&CompareFigures::fwd_step_ms);
    f.bwd_step_ms = mean_of(&CompareFigures::bwd_step_ms);
    f.fwd_exposed_ms = mean_of(&CompareFigures::fwd_exposed_ms);
    f.bwd_exposed_ms = mean_of(&CompareFigures::bwd_exposed_ms);
  }
  if (have_cb) f.compute_bound_ms = mean_of(&CompareFigures::compute_bound_ms);
  bool have_rank_path = true;
  for (const CompareRow* r : group) have_rank_path = have_rank_path && r->f.rank_path_ms;
  if (have_rank_path) f.rank_path_ms = mean_of(&CompareFigures::rank_path_ms);
  if (f.feasible_packs < out.packs)
    out.note = fmt::format("balance target not met on {} of {} packs", out.packs - f.feasible_packs, out.packs);
  else if (f.ilp_proven_packs && *f.ilp_proven_packs < out.packs)
    out.note = fmt::format("not proven optimal on {} of {} packs: mean bound {:.3f} GiB", out.packs - *f.ilp_proven_packs,
                           out.packs, gib(*f.ilp_bound));
  else
    out.note = notes;
  return out;
}

// One group per profile when the cost model takes `hardware`, else one.
std::size_t cost_group_count(const CompareSpec& spec) {
  return spec.cost_model_hardware && !spec.hardware.empty() ? spec.hardware.size() : 1;
}

std::string join_names(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The hardware axis (one unnamed slot when there is none), each profile with
// its timing runner where timing is on.
std::vector<HwSlot> hardware_slots(const CompareSpec& spec, const Registry& reg, const ConfigLoader& load,
                                   CompareResult& res) {
  std::vector<HwSlot> slots(spec.hardware.empty() ? 1 : spec.hardware.size());
  for (std::size_t i = 0; i < spec.hardware.size(); ++i) {
    slots[i].name = spec.hardware[i];
    slots[i].spec = spec.hardware_specs.at(i);
    slots[i].profile = &spec.hardware_profiles.at(i);
  }
  if (spec.timing && !spec.hardware.empty()) {
    std::string why;
    for (auto& slot : slots) {
      slot.timing = make_timing_runner(spec, slot.spec, slot.name, reg, load, why);
      if (!slot.timing) break;  // the executor plugin is missing: the same for every profile
    }
    if (slots.back().timing)
      res.timing_label = fmt::format("{} executor on hardware {}", spec.timing_executor, join_names(spec.hardware));
    else
      res.warnings.push_back("timing columns left empty: " + why);
  }
  return slots;
}

// Cost models: validated as `run` does, then one per profile when the plugin
// takes `hardware`. The groups point into `slots`.
std::vector<CostGroup> cost_groups(const Config& cfg, const CompareSpec& spec, const Registry& reg,
                                   const std::vector<HwSlot>& slots, CompareResult& res) {
  const Params cost_params = resolve_selection(reg, static_cast<int>(PluginKind::cost_model), cfg.cost_model);
  std::vector<CostGroup> groups(cost_group_count(spec));
  if (!spec.cost_model_hardware || spec.hardware.empty()) {
    groups[0].cost = reg.make_cost_model(cfg.cost_model.name, cost_params);
    for (const auto& slot : slots) groups[0].slots.push_back(&slot);
    return groups;
  }
  res.solved_per_hardware = true;
  const PluginInfo& info = reg.find(PluginKind::cost_model, cfg.cost_model.name);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    Params given = cfg.cost_model.given_params();
    given.set("hardware", slots[g].spec);
    try {
      groups[g].cost = reg.make_cost_model(cfg.cost_model.name, reg.resolve_params(info, given));
    } catch (const Error& e) {
      throw Error(fmt::format("compare.hardware: cost model '{}' with hardware '{}': {}", cfg.cost_model.name,
                              slots[g].name, e.what()));
    }
    groups[g].slots = {&slots[g]};
  }
  return groups;
}

// The compared solvers, where ilp and the reference are among them, and the
// reference's own handle where it is not.
struct SweepSolvers {
  std::vector<SolverHandle> handles;
  std::size_t ilp_index = 0;  // handles.size(): not compared
  bool ref_listed = false;
  std::size_t ref_index = 0;
  SolverHandle ref_handle;
};

SweepSolvers sweep_solvers(const CompareSpec& spec, const Registry& reg, const ConfigLoader& load,
                           CompareResult& res) {
  SweepSolvers sv;
  for (const auto& name : spec.solvers) sv.handles.push_back(make_handle(name, reg, load, spec));
  const auto ilp_it = std::find(spec.solvers.begin(), spec.solvers.end(), kIlpSolver);
  sv.ilp_index = static_cast<std::size_t>(ilp_it - spec.solvers.begin());
  const auto ref_it = std::find(spec.solvers.begin(), spec.solvers.end(), spec.reference);
  sv.ref_listed = ref_it != spec.solvers.end();
  sv.ref_index = static_cast<std::size_t>(ref_it - spec.solvers.begin());
  if (spec.reference.empty())
    res.warnings.push_back("no `usp` solver plugin was found: the usp-placement columns are left empty");
  else if (!sv.ref_listed)
    sv.ref_handle = make_handle(spec.reference, reg, load, spec);
  return sv;
}

// Every (heads, mask, P, pack) point of the sweep: each solver on each cost
// group, rows appended to res.per_pack in sweep order.
class PointSweep {
 public:
  PointSweep(const Config& cfg, const CompareSpec& spec, const std::vector<CostGroup>& groups,
             const SweepSolvers& solvers, Progress& progress, CompareResult& res)
      : cfg_(cfg), spec_(spec), groups_(groups), sv_(solvers), progress_(progress), res_(res) {}

  void run() {
    for (const auto& h : spec_.heads)
      for (MaskKind kind : spec_.masks) {
        const bool packed = mask_uses_packs(cfg_.mask, kind);
        const std::vector<int> packs = packed ? spec_.packs : std::vector<int>{cfg_.mask.pack};
        for (int P : spec_.cp_sizes)
          for (int pack : packs)
            for (Layout layout : spec_.layouts)
              for (const std::optional<PlanUses>& uses : spec_.uses) {
                CompareRow base;
                base.mask = std::string(to_string(kind));
                base.cp_size = P;
                base.heads = h;
                base.pack = packed ? pack : -1;
                base.layout = layout;
                base.asked_uses = uses;
                base.uses = uses ? *uses : default_uses(layout);
                run_point(base, h, kind, P, pack);
              }
      }
  }

 private:
  using Volumes = std::optional<std::pair<double, double>>;  // the reference's (fwd, bwd) send
  using GroupRows = std::vector<std::vector<CompareRow>>;    // [group]: rows [profile][stage count]

  void run_point(const CompareRow& base, const HeadConfig& h, MaskKind kind, int P, int pack) {
    std::shared_ptr<const Problem> problem;
    std::string problem_error;
    try {
      problem = make_point_problem(cfg_, kind, P, h, pack, base.layout);
    } catch (const Error& e) {
      problem_error = e.what();
    }
    // out[solver][group]. The reference runs first: every row of this point
    // needs its volumes.
    std::vector<GroupRows> out(sv_.handles.size(), GroupRows(groups_.size()));
    std::vector<Volumes> ref(groups_.size());
    if (sv_.ref_listed) {
      out[sv_.ref_index] = run_index(sv_.ref_index, base, problem, problem_error);
      for (std::size_t g = 0; g < groups_.size(); ++g)
        if (const CompareRow& r = out[sv_.ref_index][g].front(); r.ok)
          ref[g] = std::make_pair(r.f.fwd_send, r.f.bwd_send);
    } else if (problem && !spec_.reference.empty()) {
      unlisted_reference(problem, ref);
    }
    for (std::size_t i = 0; i < sv_.handles.size(); ++i)
      if (!(sv_.ref_listed && i == sv_.ref_index)) out[i] = run_index(i, base, problem, problem_error);
    for (std::size_t g = 0; g < groups_.size(); ++g) fill_baselines(out, g, ref[g]);
    // Sweep order within a point: solver, profile, stage count.
    for (auto& per_solver : out)
      for (auto& rows : per_solver)
        for (auto& r : rows) res_.per_pack.push_back(std::move(r));
  }

  // Solver i on every cost group (without a problem: its rows fail with
  // problem_error).
  GroupRows run_index(std::size_t i, const CompareRow& base, const std::shared_ptr<const Problem>& problem,
                      const std::string& problem_error) {
    const SolverHandle& h = sv_.handles[i];
    GroupRows rows(groups_.size());
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      if (!problem) {
        rows[g] = point_rows(base, h.name, groups_[g].slots, spec_.stages);
        for (auto& r : rows[g]) {
          r.ok = false;
          r.error = problem_error;
        }
      } else {
        rows[g] = run_solver(h, problem, *groups_[g].cost, spec_, groups_[g].slots, base);
      }
      progress_.step(point_label(base) + " " + h.name +
                     (groups_.size() > 1 ? " " + groups_[g].slots.front()->name : std::string()));
    }
    return rows;
  }

  // The reference's volumes on every cost group when it is not compared.
  void unlisted_reference(const std::shared_ptr<const Problem>& problem, std::vector<Volumes>& ref) {
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      std::string why;
      ref[g] = reference_volumes(sv_.ref_handle, problem, *groups_[g].cost, why);
      // Not a compared solver, so no row shows its failure: say it once per message.
      if (!ref[g] && ref_failures_.insert(why).second)
        res_.warnings.push_back(fmt::format("baseline `{}` failed (its columns are left empty where it did): {}",
                                            spec_.reference, why));
    }
  }

  // The ilp and reference columns of cost group g's rows.
  void fill_baselines(std::vector<GroupRows>& out, std::size_t g, const Volumes& ref) const {
    const std::size_t ns = spec_.stages.size();
    // ilp's forward send per stage count (the same on every profile of
    // the group: one solve), where it ran and met its balance target.
    std::vector<std::optional<double>> ilp_fwd(ns);
    if (sv_.ilp_index < out.size())
      for (std::size_t s = 0; s < ns && s < out[sv_.ilp_index][g].size(); ++s)
        if (const CompareRow& r = out[sv_.ilp_index][g][s]; r.ok && r.f.feasible_packs == 1) ilp_fwd[s] = r.f.fwd_send;
    for (auto& per_solver : out)
      for (std::size_t k = 0; k < per_solver[g].size(); ++k) {
        CompareRow& r = per_solver[g][k];
        if (r.ok) r.f.ilp_fwd = ilp_fwd[k % ns];
        if (r.ok && ref) {
          r.f.ref_fwd = ref->first;
          r.f.ref_bwd = ref->second;
        }
      }
  }

  const Config& cfg_;
  const CompareSpec& spec_;
  const std::vector<CostGroup>& groups_;
  const SweepSolvers& sv_;
  Progress& progress_;
  CompareResult& res_;
  std::set<std::string> ref_failures_;
};

// Groups the per-pack rows by (heads, mask, P, stages, hardware, layout, uses, solver) in
// order of first appearance, one aggregated row each.
std::vector<CompareRow> aggregate_rows(const std::vector<CompareRow>& per_pack) {
  using Key = std::tuple<int, int, int, std::string, int, int, std::string, int, std::string, std::string>;
  std::map<Key, std::size_t> index;
  std::vector<std::vector<const CompareRow*>> agg_groups;
  for (const auto& r : per_pack) {
    const Key k{r.heads.q, r.heads.kv, r.heads.dim, r.mask,   r.cp_size,
                r.stages,  r.hardware, static_cast<int>(r.layout), r.uses.str(), r.solver};
    auto [it, fresh] = index.emplace(k, agg_groups.size());
    if (fresh) agg_groups.emplace_back();
    agg_groups[it->second].push_back(&r);
  }
  std::vector<CompareRow> out;
  for (const auto& g : agg_groups) out.push_back(aggregate(g));
  return out;
}

}  // namespace

CompareResult run_compare(const Config& cfg, const CompareSpec& spec, const Registry& reg, const ConfigLoader& load,
                          Progress& progress) {
  CompareResult res;
  res.hardware = spec.hardware;
  const std::vector<HwSlot> slots = hardware_slots(spec, reg, load, res);
  const std::vector<CostGroup> groups = cost_groups(cfg, spec, reg, slots, res);
  const SweepSolvers solvers = sweep_solvers(spec, reg, load, res);
  PointSweep(cfg, spec, groups, solvers, progress, res).run();
  res.aggregated = aggregate_rows(res.per_pack);
  return res;
}

long compare_work_units(const Config& cfg, const CompareSpec& spec) {
  long n = 0;
  for (MaskKind kind : spec.masks)
    n += static_cast<long>(mask_uses_packs(cfg.mask, kind) ? spec.packs.size() : 1);
  return n * static_cast<long>(spec.heads.size() * spec.cp_sizes.size() * spec.solvers.size() *
                               cost_group_count(spec) * spec.layouts.size() * spec.uses.size());
}

}  // namespace cpsched::cli
