#include "sim_runner.hpp"

#include <fmt/format.h>

#include <chrono>

#include "cpsched/base/error.hpp"
#include "gantt_svg.hpp"
#include "parallel.hpp"
#include "plan_access.hpp"
#include "reference.hpp"
#include "report_text.hpp"
#include "cpsched/timing/model.hpp"
#include "cpsched/timing/stats.hpp"
#include "virtual_ranks.hpp"

namespace cpsched::sim {

SimOptions parse_sim_options(const Params& p) {
  SimOptions o;
  if (p.has("mode")) {
    const std::string& m = p.get_string("mode");
    if (m == "numeric") o.mode = SimMode::numeric;
    else if (m == "timing") o.mode = SimMode::timing;
    else throw Error("sim: parameter 'mode' is '" + m + "' (expected numeric or timing)");
  }
  o.hardware = resolve_hardware_profile(p.has("hardware") ? p.get_string("hardware") : kDefaultHardwareProfile);
  if (p.has("seed")) o.seed = p.get_int("seed");
  if (p.has("check_tolerance")) {
    o.tolerance = p.get_real("check_tolerance");
    if (!(o.tolerance > 0)) throw Error(fmt::format("sim: parameter 'check_tolerance' must be > 0 (got {})", o.tolerance));
  }
  if (p.has("threads")) {
    const std::int64_t t = p.get_int("threads");
    if (t < 0 || t > 4096) throw Error(fmt::format("sim: parameter 'threads' must be in [0, 4096] (got {})", t));
    o.threads = static_cast<int>(t);
  }
  if (p.has("svg_max_ranks")) {
    const std::int64_t n = p.get_int("svg_max_ranks");
    if (n < 1) throw Error(fmt::format("sim: parameter 'svg_max_ranks' must be >= 1 (got {})", n));
    o.svg_max_ranks = static_cast<int>(n);
  }
  if (p.has("max_numeric_gib")) {
    o.max_numeric_gib = p.get_real("max_numeric_gib");
    if (!(o.max_numeric_gib > 0))
      throw Error(fmt::format("sim: parameter 'max_numeric_gib' must be > 0 (got {})", o.max_numeric_gib));
  }
  return o;
}

namespace {

NumericSummary numeric_check(const Problem& problem, const Plan& plan, const SimOptions& opt, std::uint64_t seed) {
  const double gib = numeric_bytes_estimate(problem) / (1024.0 * 1024 * 1024);
  if (gib > opt.max_numeric_gib)
    throw Error(fmt::format("sim: numeric mode would hold about {:.1f} GiB of tensors (S = {}, heads {}:{}, {}); "
                            "the limit max_numeric_gib is {} GiB: use mode timing or a smaller problem",
                            gib, problem.seqlen(), problem.heads.q, problem.heads.kv, head_dims_text(problem.heads),
                            opt.max_numeric_gib));
  const auto t0 = std::chrono::steady_clock::now();
  const GlobalInputs inputs = GlobalInputs::generate(problem, seed);
  VirtualRun run = run_virtual_ranks(problem, plan, inputs, opt.threads);
  const GlobalOutputs ref = dense_reference(problem, inputs, resolve_threads(opt.threads));
  NumericSummary n;
  n.errors = compare_outputs(run.outputs, ref);
  n.tolerance = opt.tolerance;
  n.faults = std::move(run.faults);
  n.args_run = run.args_run;
  n.rows_moved = run.rows_moved;
  n.seed = seed;
  n.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return n;
}

}  // namespace

ExecutionReport run_sim(const ExecuteInput& in, const SimOptions& opt) {
  if (!in.problem) throw Error("sim: ExecuteInput has no problem");
  if (in.plan == nullptr) throw Error("sim: ExecuteInput has no plan");
  const Problem& problem = *in.problem;
  const Plan& plan = *in.plan;
  const std::uint64_t seed = opt.seed >= 0 ? static_cast<std::uint64_t>(opt.seed) : in.seed;

  ReportInputs r;
  r.problem = &problem;
  r.stages = plan.num_stages;
  r.mode = opt.mode == SimMode::numeric ? "numeric" : "timing";
  r.hardware = &opt.hardware;
  if (opt.mode == SimMode::numeric) r.numeric = numeric_check(problem, plan, opt, seed);

  const Timeline tl = simulate_timeline(problem, plan, opt.hardware);
  const PassStats fwd = pass_stats(tl.fwd), bwd = pass_stats(tl.bwd);
  r.fwd = &fwd;
  r.bwd = &bwd;
  r.compute_bound = compute_bound(problem, plan, opt.hardware);

  ExecutionReport rep;
  rep.passed = !r.numeric || r.numeric->passed();
  rep.text = report_text(r);
  rep.figures = report_figures(r);
  GanttOptions g;
  g.title = fmt::format("cpsched sim timeline: P = {}, S = {}, heads {}:{} {}, {} stage(s), hardware {}",
                        problem.cp_size(), problem.seqlen(), problem.heads.q, problem.heads.kv, head_dims_text(problem.heads),
                        plan.num_stages, opt.hardware.name);
  g.notes.push_back(fmt::format(
      "step {:.4g} ms = fwd {:.4g} + bwd {:.4g} (compute bound {:.4g} ms, step / bound {:.2f}); exposed comm (max over ranks) fwd {:.4g} ms, bwd {:.4g} ms; "
      "overlap ratio fwd {:.0f}%, bwd {:.0f}%",
      (fwd.time + bwd.time) * 1e3, fwd.time * 1e3, bwd.time * 1e3, r.compute_bound * 1e3,
      r.compute_bound > 0 ? (fwd.time + bwd.time) / r.compute_bound : 1.0, fwd.exposed_max * 1e3, bwd.exposed_max * 1e3,
      100 * fwd.overlap_ratio, 100 * bwd.overlap_ratio));
  g.max_ranks = opt.svg_max_ranks;
  rep.svg = gantt_svg(tl, g);
  return rep;
}

}  // namespace cpsched::sim
