#include "report_text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "plan_access.hpp"

namespace cpsched::sim {

namespace {

std::string ms(double seconds) { return fmt::format("{:.4f}", seconds * 1e3); }

void numeric_section(std::string& t, const ReportInputs& in) {
  const NumericSummary& n = *in.numeric;
  const Problem& p = *in.problem;
  t += fmt::format("numeric check: float32 on {} virtual ranks against a dense single-device reference "
                   "(seed {}, tolerance {:.1e} relative to max |ref|)\n",
                   p.cp_size(), n.seed, n.tolerance);
  const std::pair<const char*, double> rows[] = {
      {"O", n.errors.o}, {"lse", n.errors.lse}, {"dQ", n.errors.dq}, {"dK", n.errors.dk}, {"dV", n.errors.dv}};
  t += "  tensor  max rel err  status\n";
  for (const auto& [name, e] : rows)
    t += fmt::format("  {:<6}  {:>11.3e}  {}\n", name, e, e <= n.tolerance ? "ok" : "FAIL");
  t += fmt::format("  {} attention args run, {} rows group-cast, {:.2f} s\n", n.args_run, n.rows_moved, n.seconds);
  if (!n.faults.empty()) {
    t += fmt::format("  plan faults: {}\n", n.faults.total());
    for (const std::string& f : n.faults.shown()) t += "    " + f + "\n";
    if (n.faults.total() > n.faults.shown().size())
      t += fmt::format("    ... and {} more\n", n.faults.total() - n.faults.shown().size());
  }
  t += n.passed() ? "  numeric check PASSED\n" : "  numeric check FAILED\n";
}

void timing_section(std::string& t, const ReportInputs& in) {
  const HardwareProfile& hw = *in.hardware;
  t += fmt::format("timing model: {} ({})\n", hw.name, hw.description.empty() ? hw.source : hw.description);
  t += fmt::format("  attention {} / {} TFLOP/s fwd / bwd; HBM {} GB/s; inside a node {} GB/s, {} us; between nodes "
                   "{} GB/s, {} us; {} GPUs per node; overlap {}\n",
                   hw.fwd_tflops, hw.bwd_tflops, hw.hbm_gb_s, hw.intra_node.bandwidth_gb_s, hw.intra_node.latency_us,
                   hw.inter_node.bandwidth_gb_s, hw.inter_node.latency_us, hw.gpus_per_node, hw.overlap ? "on" : "off");
  t += "  pass  time ms    compute max  comm max   exposed max  exposed mean  overlap  idle mean  critical rank\n";
  for (const PassStats* s : {in.fwd, in.bwd})
    t += fmt::format("  {}   {:>9}  {:>11}  {:>9}  {:>11}  {:>12}  {:>6.1f}%  {:>9}  {}\n", s == in.fwd ? "fwd" : "bwd",
                     ms(s->time), ms(s->compute_max), ms(s->comm_max), ms(s->exposed_max), ms(s->exposed_mean),
                     100.0 * s->overlap_ratio, ms(s->idle_mean), s->critical_rank);
  const double step = in.fwd->time + in.bwd->time;
  t += fmt::format("  step time (fwd + bwd): {} ms; compute bound {} ms; step / bound {}\n", ms(step),
                   ms(in.compute_bound), in.compute_bound > 0 ? fmt::format("{:.2f}", step / in.compute_bound) : "-");

  // Per rank: all of them for small P, else the slowest few.
  const std::size_t P = in.fwd->ranks.size();
  std::vector<std::size_t> order(P);
  std::iota(order.begin(), order.end(), 0);
  constexpr std::size_t kAll = 16, kSome = 8;
  if (P > kAll) {
    auto total = [&](std::size_t r) { return in.fwd->ranks[r].end + in.bwd->ranks[r].end; };
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return total(a) > total(b); });
    order.resize(kSome);
    t += fmt::format("  the {} slowest of {} ranks (ms):\n", kSome, P);
  } else {
    t += "  per rank (ms):\n";
  }
  t += "  rank  fwd end    compute    comm       exposed    bwd end    compute    comm       exposed\n";
  for (std::size_t r : order) {
    const RankStats &f = in.fwd->ranks[r], &b = in.bwd->ranks[r];
    t += fmt::format("  {:>4}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}\n", r, ms(f.end), ms(f.compute),
                     ms(f.comm), ms(f.exposed), ms(b.end), ms(b.compute), ms(b.comm), ms(b.exposed));
  }
}

}  // namespace

std::string report_text(const ReportInputs& in) {
  const Problem& p = *in.problem;
  std::string t = fmt::format("sim executor: mode {}, hardware {}\n", in.mode, in.hardware->name);
  t += fmt::format("problem: S = {}, P = {}, heads {}:{} ({}, {} bytes), {} head groups, {} remote stage(s)\n",
                   p.seqlen(), p.cp_size(), p.heads.q, p.heads.kv, head_dims_text(p.heads), p.heads.dtype_bytes, p.num_groups(),
                   in.stages);
  if (in.numeric) numeric_section(t, in);
  timing_section(t, in);
  return t;
}

Figures report_figures(const ReportInputs& in) {
  Figures f;
  if (in.numeric) {
    const NumericSummary& n = *in.numeric;
    f.set("numeric_passed", n.passed() ? 1.0 : 0.0);
    f.set("o_max_rel_err", n.errors.o);
    f.set("lse_max_rel_err", n.errors.lse);
    f.set("dq_max_rel_err", n.errors.dq);
    f.set("dk_max_rel_err", n.errors.dk);
    f.set("dv_max_rel_err", n.errors.dv);
    f.set("plan_faults", static_cast<double>(n.faults.total()));
  }
  const double step = in.fwd->time + in.bwd->time;
  f.set("step_time_ms", step * 1e3);
  f.set("compute_bound_ms", in.compute_bound * 1e3);
  f.set("step_over_bound", in.compute_bound > 0 ? step / in.compute_bound : 1.0);
  for (const PassStats* s : {in.fwd, in.bwd}) {
    const std::string p = s == in.fwd ? "fwd_" : "bwd_";
    f.set(p + "time_ms", s->time * 1e3);
    f.set(p + "compute_max_ms", s->compute_max * 1e3);
    f.set(p + "comm_max_ms", s->comm_max * 1e3);
    f.set(p + "exposed_comm_max_ms", s->exposed_max * 1e3);
    f.set(p + "exposed_comm_mean_ms", s->exposed_mean * 1e3);
    f.set(p + "overlap_ratio", s->overlap_ratio);
    f.set(p + "idle_mean_ms", s->idle_mean * 1e3);
  }
  return f;
}

}  // namespace cpsched::sim
