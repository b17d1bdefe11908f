#include "rank_run.hpp"

#include <algorithm>
#include <exception>
#include <optional>
#include <fmt/format.h>

#include "check.hpp"
#include "collectives.hpp"
#include "emulate.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/timing/model.hpp"
#include "inputs.hpp"
#include "pipeline.hpp"
#include "host/plan/plan_codec.hpp"

namespace cpsched::gpu {

RunOptions parse_run_options(const Params& p) {
  RunOptions o;
  auto one_of = [&](const char* name, std::string v, std::initializer_list<const char*> allowed) {
    for (const char* a : allowed)
      if (v == a) return v;
    std::string list;
    for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
    throw Error(fmt::format("cuda_nccl: parameter {} = '{}' is not one of {}", name, v, list));
  };
  if (p.has("backend")) o.backend = one_of("backend", p.get_string("backend"), {"cuda", "emulate"});
  if (p.has("launch")) o.launch = one_of("launch", p.get_string("launch"), {"auto", "mpi", "env", "single", "loopback"});
  if (p.has("plan_source"))
    o.plan_source = one_of("plan_source", p.get_string("plan_source"), {"solve_everywhere", "broadcast"});
  if (p.has("check")) o.check = p.get_bool("check");
  if (p.has("tolerance")) o.tolerance = p.get_real("tolerance");
  if (!(o.tolerance > 0)) throw Error(fmt::format("cuda_nccl: parameter tolerance = {} must be positive", o.tolerance));
  if (p.has("warmup")) o.warmup = static_cast<int>(p.get_int("warmup"));
  if (p.has("iterations")) o.iterations = static_cast<int>(p.get_int("iterations"));
  if (o.warmup < 0 || o.iterations < 1)
    throw Error(fmt::format("cuda_nccl: parameters warmup = {} (>= 0) and iterations = {} (>= 1)", o.warmup,
                            o.iterations));
  if (p.has("seed")) {
    const auto s = p.get_int("seed");
    if (s < 0) throw Error(fmt::format("cuda_nccl: parameter seed = {} must be >= 0", s));
    o.seed = static_cast<std::uint64_t>(s);
  }
  if (p.has("threads")) o.threads = static_cast<int>(p.get_int("threads"));
  if (p.has("compute_timing")) o.compute_timing = p.get_bool("compute_timing");
  if (p.has("hardware")) o.hardware = p.get_string("hardware");
  if (p.has("attention")) {
    const std::string a = one_of("attention", p.get_string("attention"), {"auto", "cudnn", "kernels"});
    o.attention = a == "auto" ? AttentionMode::automatic : a == "cudnn" ? AttentionMode::cudnn : AttentionMode::kernels;
  }
  if (p.has("schedule")) {
    const std::string s = one_of("schedule", p.get_string("schedule"), {"eager", "lazy_comm", "lazy_compute"});
    o.schedule = s == "eager" ? Schedule::eager : s == "lazy_comm" ? Schedule::lazy_comm : Schedule::lazy_compute;
  }
  return o;
}

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Per-rank figures travelling to rank 0, in this order; then each pass's
// RouteSummary (args, then area, by reason).
// kModelFwdMs / kModelBwdMs: the kernel model's compute of the rank's plan
// (-1 without a kernel table).
enum Fig {
  kFwdMs, kBwdMs, kFwdFlops, kBwdFlops, kDeviceBytes, kSendBytes, kRecvBytes, kGraphs, kGraphSeconds, kModelFwdMs,
  kModelBwdMs, kNumFigs
};
// With compute_timing, after the check, in this order.
enum ComputeFig { kAloneFwdMs, kAloneBwdMs, kDirectFwdMs, kDirectBwdMs, kDirectFwdFlops, kDirectBwdFlops, kNumComputeFigs };
constexpr std::size_t kRouteFigs = 2 * kNumRouteReasons;

void put_routes(std::vector<double>& figs, const RouteSummary& r) {
  for (const i64 x : r.args) figs.push_back(static_cast<double>(x));
  for (const i64 x : r.area) figs.push_back(static_cast<double>(x));
}

RouteSummary get_routes(const std::vector<double>& f, std::size_t at) {
  RouteSummary r;
  for (std::size_t i = 0; i < kNumRouteReasons; ++i) {
    r.args[i] = static_cast<i64>(f[at + i]);
    r.area[i] = static_cast<i64>(f[at + kNumRouteReasons + i]);
  }
  return r;
}

// Bytes of one rank's fp32 outputs (o, lse, dq, dk, dv) for `rows` tokens.
Bytes outputs_bytes(Token rows, const HeadLayout& h) {
  return 4 * rows * static_cast<Bytes>(output_widths(h).total());
}

Blob outputs_blob(const RankOutputs& o) {
  std::vector<float> all;
  for (const auto* v : {&o.o, &o.lse, &o.dq, &o.dk, &o.dv}) all.insert(all.end(), v->begin(), v->end());
  return to_blob(all);
}

RankOutputs outputs_from_blob(const Blob& b, Token rows, const HeadLayout& h) {
  const std::vector<float> all = from_blob<float>(b);
  const OutputWidths w = output_widths(h);
  const auto n = static_cast<std::size_t>(rows);
  const std::size_t sizes[5] = {n * w.o, n * w.lse, n * w.q, n * w.k, n * w.v};
  std::size_t want = 0;
  for (std::size_t s : sizes) want += s;
  if (all.size() != want) throw Error(fmt::format("cuda_nccl check: gathered {} floats, expected {}", all.size(), want));
  RankOutputs o;
  std::vector<float>* dst[5] = {&o.o, &o.lse, &o.dq, &o.dk, &o.dv};
  std::size_t at = 0;
  for (int i = 0; i < 5; ++i) {
    dst[i]->assign(all.begin() + static_cast<std::ptrdiff_t>(at), all.begin() + static_cast<std::ptrdiff_t>(at + sizes[i]));
    at += sizes[i];
  }
  return o;
}

}  // namespace

ExecutionReport run_rank(Backend& be, const Problem& problem, const Plan& plan, const RunOptions& opt,
                         std::uint64_t seed) {
  const Rank me = be.rank();
  const int P = be.world();
  if (plan.sharding.cp_size != P || static_cast<int>(plan.ranks.size()) != P)
    throw Error(fmt::format("cuda_nccl: {} processes were started for a plan of {} ranks (cp_size); launch one "
                            "process per rank",
                            P, plan.sharding.cp_size));
  const HeadLayout h = HeadLayout::of(problem);
  // Resolved before any collective, so that a bad name fails every rank alike.
  const HardwareProfile hw = resolve_hardware_profile(opt.hardware);
  // The collectives' device buffer, sized once from the plan: the figures,
  // every rank's sizes and, with the check, the largest rank's outputs (rank
  // 0 receives them one rank at a time). A broadcast plan larger than that
  // grows it once.
  Bytes staging_bytes = std::max<Bytes>(8 * P, static_cast<Bytes>(kNumFigs * sizeof(double)));
  if (opt.check)
    for (Rank r = 0; r < P; ++r) staging_bytes = std::max(staging_bytes, outputs_bytes(plan.sharding.rank_tokens(r).size(), h));
  Staging staging(be, staging_bytes);

  // This rank's plan: its own slice of the local solve, or rank 0's.
  RankPlan mine;
  Bytes plan_bytes = 0;
  if (opt.plan_source == "broadcast") {
    std::vector<Blob> blobs;
    if (me == 0)
      for (const RankPlan& rp : plan.ranks) blobs.push_back(encode_rank_plan(rp, plan.num_stages));
    const Blob b = scatter_from_root(staging, me == 0 ? &blobs : nullptr);
    plan_bytes = static_cast<Bytes>(b.size());
    mine = decode_rank_plan(b);
  } else {
    mine = plan.ranks[static_cast<std::size_t>(me)];
  }

  const Token rows = plan.sharding.rank_tokens(me).size();
  PipelineOptions popt;
  popt.attention = opt.attention;
  RankPipeline pipe(be, mine, h, rows, popt);
  pipe.set_inputs(shard_inputs(problem, plan.sharding, me, seed));
  for (int i = 0; i < opt.warmup; ++i) {
    pipe.forward();
    pipe.backward();
    pipe.synchronize();
  }
  std::vector<double> fwd, bwd;
  for (int i = 0; i < opt.iterations; ++i) {
    pipe.forward();
    pipe.backward();
    pipe.synchronize();
    fwd.push_back(pipe.forward_ms());
    bwd.push_back(pipe.backward_ms());
  }

  std::vector<double> figs(kNumFigs, 0.0);
  figs[kFwdMs] = median(fwd);
  figs[kBwdMs] = median(bwd);
  figs[kFwdFlops] = pass_flops(mine.fwd.calc, problem, Pass::fwd);
  figs[kBwdFlops] = pass_flops(mine.bwd.calc, problem, Pass::bwd);
  figs[kDeviceBytes] = static_cast<double>(pipe.sizes().total() + pipe.metadata_bytes() + pipe.scratch_bytes() +
                                           be.sdpa_stats().workspace);  // index pools count
  for (Pass ps : {Pass::fwd, Pass::bwd})
    for (const StageLists& st : pipe.lists(ps).stages)
      for (RowKind k : {RowKind::qo, RowKind::kv})
        for (const KindLists* kl : {&st.of(k), &st.fwd_of(k)}) {  // forwarding phase (relays) included
          figs[kSendBytes] += static_cast<double>(kl->cast_send.bytes + kl->reduce_send.bytes);
          figs[kRecvBytes] += static_cast<double>(kl->cast_recv.bytes + kl->reduce_recv.bytes);
        }
  figs[kModelFwdMs] = figs[kModelBwdMs] = -1;
  if (hw.kernel) {
    figs[kModelFwdMs] = 1e3 * compute_seconds(problem, mine.fwd, hw, cpsched::Pass::fwd);
    figs[kModelBwdMs] = 1e3 * compute_seconds(problem, mine.bwd, hw, cpsched::Pass::bwd);
  }
  figs[kGraphs] = be.sdpa_stats().graphs;
  figs[kGraphSeconds] = be.sdpa_stats().build_s;
  put_routes(figs, pipe.sdpa(Pass::fwd).routes.summary);
  put_routes(figs, pipe.sdpa(Pass::bwd).routes.summary);
  const std::vector<Blob> all_figs = gather_to_root(staging, to_blob(figs));

  // Self-check at rank 0, verdict back to every rank.
  std::string check_text;
  bool passed = true;
  if (opt.check) {
    // Rank 0 runs the reference, then compares one rank's outputs at a time.
    std::optional<RankwiseCheck> check;
    if (me == 0) check.emplace(problem, plan, seed, opt.threads);
    gather_each_to_root(staging, outputs_blob(pipe.outputs()), [&](Rank r, const Blob& b) {
      check->add(r, outputs_from_blob(b, plan.sharding.rank_tokens(r).size(), h));
    });
    std::vector<std::uint8_t> verdict(1, 1);
    if (me == 0) {
      const CheckResult c = check->finish(opt.tolerance);
      check_text = c.text;
      verdict[0] = c.passed ? 1 : 0;
    }
    verdict = broadcast_from_root(staging, verdict);
    passed = !verdict.empty() && verdict[0] == 1;
    if (me != 0) check_text = fmt::format("self-check at rank 0: {}", passed ? "passed" : "FAILED");
  }

  // Compute alone, one rank at a time (a barrier between turns, so that no
  // other rank's work shares the device or the link).
  std::vector<Blob> compute_figs;
  if (opt.compute_timing) {
    auto barrier = [&] {
      gather_to_root(staging, Blob(1, 0));
      broadcast_from_root(staging, Blob(1, 0));
    };
    std::vector<double> cf(kNumComputeFigs, 0.0);
    for (Rank turn = 0; turn < P; ++turn) {
      barrier();
      if (turn != me) continue;
      auto timed = [&](Pass ps, bool sdpa_only) {
        std::vector<double> ms;
        pipe.time_compute(ps, sdpa_only);  // warm-up
        for (int i = 0; i < opt.iterations; ++i) ms.push_back(pipe.time_compute(ps, sdpa_only));
        return median(ms);
      };
      cf[kAloneFwdMs] = timed(Pass::fwd, false);
      cf[kAloneBwdMs] = timed(Pass::bwd, false);
      const bool any_sdpa = pipe.sdpa(Pass::fwd).routes.summary.cudnn_args() + pipe.sdpa(Pass::bwd).routes.summary.cudnn_args() > 0;
      if (any_sdpa) {
        cf[kDirectFwdMs] = timed(Pass::fwd, true);
        cf[kDirectBwdMs] = timed(Pass::bwd, true);
      }
      cf[kDirectFwdFlops] = cudnn_flops(mine.fwd.calc, pipe.sdpa(Pass::fwd).routes, problem, Pass::fwd);
      cf[kDirectBwdFlops] = cudnn_flops(mine.bwd.calc, pipe.sdpa(Pass::bwd).routes, problem, Pass::bwd);
    }
    barrier();
    compute_figs = gather_to_root(staging, to_blob(cf));
  }

  ExecutionReport rep;
  rep.passed = passed;
  std::string& t = rep.text;
  const std::string lacks = be.sdpa_support();
  t += fmt::format("cuda_nccl: {}; plan from {}{}; attention {}{}; {} warm-up + {} timed iteration(s), medians\n",
                   be.describe(), opt.plan_source, plan_bytes > 0 ? fmt::format(" ({} bytes)", plan_bytes) : "",
                   to_string(opt.attention), lacks.empty() ? "" : fmt::format(" (no cuDNN: {})", lacks), opt.warmup,
                   opt.iterations);
  if (me == 0) {
    // The kernel model's compute beside the measured pass (it holds no transfer).
    const bool model = hw.kernel.has_value();
    if (model) t += fmt::format("model: the kernel model of hardware profile {}, the rank's compute alone\n", hw.name);
    t += fmt::format("{:>5} {:>10} {:>10} {:>12} {:>12} {:>11} {:>11} {:>11}{}\n", "rank", "fwd ms", "bwd ms",
                     "fwd TFLOP/s", "bwd TFLOP/s", "send MiB", "recv MiB", "device MiB",
                     model ? fmt::format(" {:>10} {:>10}", "model fwd", "model bwd") : "");
    double model_fmax = 0, model_bmax = 0;
    double fmax = 0, bmax = 0, fsum = 0, bsum = 0, graphs_max = 0, build_max = 0;
    RouteSummary routes[2];
    for (Rank r = 0; r < P; ++r) {
      const std::vector<double> f = from_blob<double>(all_figs[static_cast<std::size_t>(r)]);
      if (f.size() != kNumFigs + 2 * kRouteFigs) throw Error("cuda_nccl: malformed per-rank figures");
      routes[0].add(get_routes(f, kNumFigs));
      routes[1].add(get_routes(f, kNumFigs + kRouteFigs));
      graphs_max = std::max(graphs_max, f[kGraphs]);
      build_max = std::max(build_max, f[kGraphSeconds]);
      auto tflops = [](double flops, double ms) { return ms > 0 ? flops / (ms * 1e9) : 0.0; };
      t += fmt::format("{:>5} {:>10.3f} {:>10.3f} {:>12.2f} {:>12.2f} {:>11.1f} {:>11.1f} {:>11.1f}{}\n", r, f[kFwdMs],
                       f[kBwdMs], tflops(f[kFwdFlops], f[kFwdMs]), tflops(f[kBwdFlops], f[kBwdMs]),
                       f[kSendBytes] / 1048576.0, f[kRecvBytes] / 1048576.0, f[kDeviceBytes] / 1048576.0,
                       model ? fmt::format(" {:>10.3f} {:>10.3f}", f[kModelFwdMs], f[kModelBwdMs]) : "");
      const std::string id = fmt::format("rank{}", r);
      if (model) {
        rep.figures.set(id + ".model_fwd_ms", f[kModelFwdMs]);
        rep.figures.set(id + ".model_bwd_ms", f[kModelBwdMs]);
        model_fmax = std::max(model_fmax, f[kModelFwdMs]);
        model_bmax = std::max(model_bmax, f[kModelBwdMs]);
      }
      rep.figures.set(id + ".fwd_ms", f[kFwdMs]);
      rep.figures.set(id + ".bwd_ms", f[kBwdMs]);
      rep.figures.set(id + ".fwd_tflops", tflops(f[kFwdFlops], f[kFwdMs]));
      rep.figures.set(id + ".bwd_tflops", tflops(f[kBwdFlops], f[kBwdMs]));
      fmax = std::max(fmax, f[kFwdMs]);
      bmax = std::max(bmax, f[kBwdMs]);
      fsum += f[kFwdFlops];
      bsum += f[kBwdFlops];
    }
    const double ftf = fmax > 0 ? fsum / (fmax * 1e9) : 0.0, btf = bmax > 0 ? bsum / (bmax * 1e9) : 0.0;
    t += fmt::format("{:>5} {:>10.3f} {:>10.3f} {:>12.2f} {:>12.2f}   (slowest rank; all ranks' FLOPs over its time{})\n",
                     "all", fmax, bmax, ftf, btf,
                     model ? fmt::format("; model: slowest rank's compute {:.3f} / {:.3f} ms", model_fmax, model_bmax)
                           : "");
    if (model) {
      rep.figures.set("model_fwd_ms", model_fmax);
      rep.figures.set("model_bwd_ms", model_bmax);
    }
    if (fmax == 0) t += "      (no clock: the CPU emulation measures no time)\n";
    t += fmt::format("attention (all ranks), forward: {}\n", routes[0].text());
    t += fmt::format("attention (all ranks), backward: {}\n", routes[1].text());
    if (graphs_max > 0) t += fmt::format("SDPA graphs per rank: at most {} ({:.2f} s to build)\n", graphs_max, build_max);
    if (!pipe.sdpa_failures().empty())
      t += fmt::format("rank 0: cuDNN could not build {} graph(s), their args ran on the kernels; the first: {}\n",
                       pipe.sdpa_failures().size(), pipe.sdpa_failures().front());
    const auto route_figs = [&](const char* pass, const RouteSummary& rs) {
      rep.figures.set(fmt::format("{}_cudnn_args", pass), static_cast<double>(rs.cudnn_args()));
      rep.figures.set(fmt::format("{}_kernel_args", pass), static_cast<double>(rs.kernel_args()));
      rep.figures.set(fmt::format("{}_cudnn_area", pass), static_cast<double>(rs.cudnn_area()));
      rep.figures.set(fmt::format("{}_kernel_area", pass), static_cast<double>(rs.kernel_area()));
    };
    route_figs("fwd", routes[0]);
    route_figs("bwd", routes[1]);
    if (!compute_figs.empty()) {
      // Each rank's compute alone, and cuDNN alone on its batches.
      t += fmt::format("compute alone, one rank at a time (no transfers); cuDNN alone: its graphs on the same batches\n");
      t += fmt::format("{:>5} {:>10} {:>10} {:>12} {:>12} {:>10} {:>10} {:>12} {:>12}{}\n", "rank", "fwd ms", "bwd ms",
                       "fwd TFLOP/s", "bwd TFLOP/s", "cuDNN fwd", "cuDNN bwd", "cuDNN fwd TF", "cuDNN bwd TF",
                       model ? fmt::format(" {:>10} {:>10} {:>9} {:>9}", "model fwd", "model bwd", "fwd/model",
                                           "bwd/model")
                             : "");
      auto tf = [](double flops, double ms) { return ms > 0 ? flops / (ms * 1e9) : 0.0; };
      for (Rank r = 0; r < P; ++r) {
        const std::vector<double> c = from_blob<double>(compute_figs[static_cast<std::size_t>(r)]);
        const std::vector<double> f = from_blob<double>(all_figs[static_cast<std::size_t>(r)]);
        if (c.size() != kNumComputeFigs) throw Error("cuda_nccl: malformed compute figures");
        auto ratio = [](double ms, double model_ms) { return model_ms > 0 ? ms / model_ms : 0.0; };
        t += fmt::format("{:>5} {:>10.3f} {:>10.3f} {:>12.2f} {:>12.2f} {:>10.3f} {:>10.3f} {:>12.2f} {:>12.2f}{}\n", r,
                         c[kAloneFwdMs], c[kAloneBwdMs], tf(f[kFwdFlops], c[kAloneFwdMs]),
                         tf(f[kBwdFlops], c[kAloneBwdMs]), c[kDirectFwdMs], c[kDirectBwdMs],
                         tf(c[kDirectFwdFlops], c[kDirectFwdMs]), tf(c[kDirectBwdFlops], c[kDirectBwdMs]),
                         model ? fmt::format(" {:>10.3f} {:>10.3f} {:>9.2f} {:>9.2f}", f[kModelFwdMs], f[kModelBwdMs],
                                             ratio(c[kAloneFwdMs], f[kModelFwdMs]),
                                             ratio(c[kAloneBwdMs], f[kModelBwdMs]))
                               : "");
        const std::string id = fmt::format("rank{}", r);
        rep.figures.set(id + ".alone_fwd_ms", c[kAloneFwdMs]);
        rep.figures.set(id + ".alone_bwd_ms", c[kAloneBwdMs]);
        rep.figures.set(id + ".alone_fwd_tflops", tf(f[kFwdFlops], c[kAloneFwdMs]));
        rep.figures.set(id + ".alone_bwd_tflops", tf(f[kBwdFlops], c[kAloneBwdMs]));
        rep.figures.set(id + ".cudnn_fwd_tflops", tf(c[kDirectFwdFlops], c[kDirectFwdMs]));
        rep.figures.set(id + ".cudnn_bwd_tflops", tf(c[kDirectBwdFlops], c[kDirectBwdMs]));
      }
    }
    rep.figures.set("fwd_ms", fmax);
    rep.figures.set("bwd_ms", bmax);
    rep.figures.set("fwd_tflops", ftf);
    rep.figures.set("bwd_tflops", btf);
  }
  if (!check_text.empty()) t += check_text + "\n";
  return rep;
}

ExecutionReport run_in_process(const Problem& problem, const Plan& plan, const RunOptions& opt, std::uint64_t seed,
                               const RankBackendFactory& make) {
  const int P = plan.sharding.cp_size;
  if (P < 1) throw Error("cuda_nccl: the plan has no ranks");
  HostWorld world(P);
  std::vector<ExecutionReport> reps(static_cast<std::size_t>(P));
  run_rank_threads(world, P, [&](Rank r) {
    const std::unique_ptr<Backend> be = make(world, r);
    reps[static_cast<std::size_t>(r)] = run_rank(*be, problem, plan, opt, seed);
  });
  ExecutionReport rep = std::move(reps[0]);
  for (const auto& r : reps) rep.passed = rep.passed && r.passed;
  return rep;
}

ExecutionReport run_emulated(const Problem& problem, const Plan& plan, const RunOptions& opt, std::uint64_t seed) {
  return run_in_process(problem, plan, opt, seed, [&](HostWorld& world, Rank r) -> std::unique_ptr<Backend> {
    return std::make_unique<HostBackend>(world, r, opt.schedule);
  });
}

}  // namespace cpsched::gpu
