// The GPU runtime's attention at hardware speed, on one GPU (a benchmark, not
// a test; exits 77 without a device): the kernel table of
// runtimes/cuda_nccl/README.md, "The kernel table".
//
// For each mask and tokens per rank (configs/quickstart.yaml's documents,
// heads 64:8, D 128, bf16 by default), forward and backward TFLOP/s of
//   (a) cuDNN's SDPA graphs called directly on the runtime's batches of the
//       P = 1 plan (no merges, no kernels: the library's ceiling here),
//   (b) the runtime at P = 1 (a whole pass: fills, cuDNN batches, merges,
//       the runtime's kernels on the args cuDNN does not take),
//   (c) each rank's compute at loopback P = 8 (the default solver's plan,
//       ranks as threads on this GPU; each rank timed alone, one at a time,
//       every stage's attention back to back without transfers), as the
//       slowest rank's time over its FLOPs at the P = 1 rate (the README's
//       target: <= 1.25) and the lowest rank rate;
// then DSA's index kernels on configs/dsa.yaml's own shapes (MLA 128:1,
// d_qk 576 / d_v 512, one shared latent row per token; --dsa-size tokens,
// a comma list) in TFLOP/s of selected pairs. FLOPs are the timing model's
// (4 x area x heads x D forward, 2.5x backward; MLA: docs/heads.md). Beside (b) and (c): the measured time over the kernel model's
// predicted compute (--hardware's profile, when it has a kernel table; (b)
// holds the whole pass, (c) the worst rank's compute alone). Prints a table
// and writes it as CSV (--csv).
//
//   bench_gpu_attention [--masks causal,causal_document,full_document,sliding_window]
//                       [--sizes 8192,16384,32768] [--p8-sizes 8192,16384,32768]
//                       [--heads 64:8] [--dim 128] [--iterations 3] [--dsa-size 16384,32768]
//                       [--csv FILE] [--configs DIR] [--hardware h100_8x_nvlink]
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../../tools/bench/bench_common.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/config/config.hpp"
#include "cpsched/session/session.hpp"
#include "cpsched/hardware/profile.hpp"
#include "device/cuda_backend.hpp"
#include "device/cudnn_sdpa.hpp"
#include "host/run/rank_run.hpp"

using namespace cpsched;
namespace g = cpsched::gpu;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

struct Run {
  ExecutionReport rep;
  int P = 1;
  double fig(const std::string& n) const { return rep.figures.get(n).value_or(0.0); }
};

// The config's problem with `overrides`, solved (default solver unless the
// config names one), run on this GPU with `P` loopback ranks.
Run run(const std::string& config, const std::vector<std::string>& overrides, int iterations, bool compute_timing,
        const std::string& hardware) {
  const Config cfg = load_config(config, overrides);
  Session session(cfg);
  const SolveResult& s = session.solve_config_mask();
  const Plan& plan = *s.plan;
  g::RunOptions opt;
  opt.launch = "loopback";
  opt.warmup = 1;
  opt.iterations = iterations;
  opt.compute_timing = compute_timing;
  opt.hardware = hardware;
  opt.attention = g::AttentionMode::automatic;
  Run r;
  r.P = plan.sharding.cp_size;
  r.rep = g::run_in_process(session.problem(), plan, opt, 1, [](g::HostWorld& world, Rank rank) {
    return g::make_cuda_loopback_backend(world, rank, 0);
  });
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (g::cuda_device_count() == 0) {
    fmt::print("no CUDA device: skipped\n");
    return 77;
  }
  const std::string configs = bench::arg(argc, argv, "--configs", "configs");
  const auto masks = split(bench::arg(argc, argv, "--masks", "causal,causal_document,full_document,sliding_window"));
  const auto sizes = split(bench::arg(argc, argv, "--sizes", "8192,16384,32768"));
  const auto p8 = split(bench::arg(argc, argv, "--p8-sizes", "8192,16384,32768"));
  const std::string heads = bench::arg(argc, argv, "--heads", "64:8");
  const std::string dim = bench::arg(argc, argv, "--dim", "128");
  const int iterations = std::stoi(bench::arg(argc, argv, "--iterations", "3"));
  const std::string dsa_size = bench::arg(argc, argv, "--dsa-size", "16384,32768");
  const std::string csv_path = bench::arg(argc, argv, "--csv", "");
  const std::string hardware = bench::arg(argc, argv, "--hardware", kDefaultHardwareProfile);
  const auto hq = heads.substr(0, heads.find(':')), hkv = heads.substr(heads.find(':') + 1);
  const std::string heads_set = fmt::format("problem.heads={{q: {}, kv: {}, dim: {}, dtype: bf16}}", hq, hkv, dim);
  fmt::print("{}; heads {}, D {}, bf16; medians of {} iterations after 1 warm-up\n", g::cudnn::describe_build(), heads,
             dim, iterations);
  std::vector<std::string> csv = {
      "mask,tokens_per_rank,cudnn_fwd_tflops,cudnn_bwd_tflops,runtime_fwd_tflops,runtime_bwd_tflops,"
      "runtime_vs_cudnn_fwd,runtime_vs_cudnn_bwd,p8_rank_min_fwd_tflops,p8_rank_min_bwd_tflops,"
      "p8_worst_time_over_area_fwd,p8_worst_time_over_area_bwd,cudnn_area_share,runtime_fwd_over_model,"
      "runtime_bwd_over_model,p8_worst_over_model_fwd,p8_worst_over_model_bwd"};
  fmt::print("model: measured time / the kernel model's predicted compute of hardware profile {} (0: no kernel table)\n",
             hardware);
  fmt::print("\n{:<16} {:>7} | {:>9} {:>9} | {:>9} {:>9} {:>6} {:>6} {:>6} {:>6} | {:>9} {:>9} {:>6} {:>6} {:>6} {:>6} | "
             "{:>6}\n",
             "mask", "S/rank", "(a) fwd", "(a) bwd", "(b) fwd", "(b) bwd", "b/a f", "b/a b", "b/m f", "b/m b",
             "(c) fwd", "(c) bwd", "x1.25f", "x1.25b", "c/m f", "c/m b", "cuDNN%");
  int failed = 0;
  for (const std::string& mask : masks)
    for (const std::string& S : sizes) {
      try {
        const std::vector<std::string> base = {"problem.cp_size=1", "problem.seqlen_per_rank=" + S, heads_set,
                                               "problem.mask.kind=" + mask};
        const Run one = run(configs + "/quickstart.yaml", base, iterations, true, hardware);
        // measured over predicted (0 where the profile has no kernel table)
        auto over = [](double ms, double model_ms) { return model_ms > 0 ? ms / model_ms : 0.0; };
        const double mf = over(one.fig("fwd_ms"), one.fig("model_fwd_ms")),
                     mb = over(one.fig("bwd_ms"), one.fig("model_bwd_ms"));
        const double af = one.fig("rank0.cudnn_fwd_tflops"), ab = one.fig("rank0.cudnn_bwd_tflops");
        const double bf = one.fig("fwd_tflops"), bb = one.fig("bwd_tflops");
        const double share = (one.fig("fwd_cudnn_area") + one.fig("fwd_kernel_area")) > 0
                                 ? one.fig("fwd_cudnn_area") / (one.fig("fwd_cudnn_area") + one.fig("fwd_kernel_area"))
                                 : 0.0;
        // (c): each rank alone at P = 8, against its FLOPs at the P = 1 rate.
        double cf = 0, cb = 0, wf = 0, wb = 0, cmf = 0, cmb = 0;
        if (std::find(p8.begin(), p8.end(), S) != p8.end()) {
          std::vector<std::string> o8 = base;
          o8[0] = "problem.cp_size=8";
          const Run eight = run(configs + "/quickstart.yaml", o8, iterations, true, hardware);
          cf = cb = 1e30;
          for (int r = 0; r < eight.P; ++r) {
            const std::string id = fmt::format("rank{}", r);
            const double rf = eight.fig(id + ".alone_fwd_tflops"), rb = eight.fig(id + ".alone_bwd_tflops");
            cf = std::min(cf, rf);
            cb = std::min(cb, rb);
            // time / (flops / P=1 rate) = P=1 rate / rank rate
            if (rf > 0) wf = std::max(wf, bf / rf);
            if (rb > 0) wb = std::max(wb, bb / rb);
            cmf = std::max(cmf, over(eight.fig(id + ".alone_fwd_ms"), eight.fig(id + ".model_fwd_ms")));
            cmb = std::max(cmb, over(eight.fig(id + ".alone_bwd_ms"), eight.fig(id + ".model_bwd_ms")));
          }
        }
        fmt::print("{:<16} {:>7} | {:>9.1f} {:>9.1f} | {:>9.1f} {:>9.1f} {:>6.2f} {:>6.2f} {:>6.2f} {:>6.2f} | {:>9.1f} "
                   "{:>9.1f} {:>6.2f} {:>6.2f} {:>6.2f} {:>6.2f} | {:>5.1f}%\n",
                   mask, S, af, ab, bf, bb, af > 0 ? bf / af : 0.0, ab > 0 ? bb / ab : 0.0, mf, mb, cf, cb, wf, wb,
                   cmf, cmb, 100 * share);
        std::fflush(stdout);
        csv.push_back(fmt::format(
            "{},{},{:.2f},{:.2f},{:.2f},{:.2f},{:.3f},{:.3f},{:.2f},{:.2f},{:.3f},{:.3f},{:.4f},{:.3f},{:.3f},{:.3f},{:.3f}",
            mask, S, af, ab, bf, bb, af > 0 ? bf / af : 0.0, ab > 0 ? bb / ab : 0.0, cf, cb, wf, wb, share, mf, mb, cmf,
            cmb));
      } catch (const std::exception& e) {
        fmt::print("{:<16} {:>7} | FAILED: {}\n", mask, S, e.what());
        ++failed;
      }
    }
  // DSA's index kernels on configs/dsa.yaml's own shapes (MLA: 128 query heads
  // on one shared latent row, d_qk 576 / d_v 512; token top-k 2048): every
  // arg is an index arg, so the pass rate is theirs, in TFLOP/s of selected
  // pairs (2 d_qk + 2 d_v FLOPs per pair and head forward, 6 d_qk + 4 d_v
  // backward: docs/heads.md).
  for (const std::string& S : split(dsa_size)) {
    try {
      const Run d = run(configs + "/dsa.yaml", {"problem.cp_size=1", "problem.seqlen_per_rank=" + S}, iterations,
                        false, hardware);
      fmt::print("\nDSA index kernels (configs/dsa.yaml: MLA 128:1, d_qk 576 / d_v 512, shared latent, top-k 2048; S = "
                 "{}, P = 1): forward {:.1f}, backward {:.1f} TFLOP/s of selected pairs ({:.3f} / {:.3f} ms; model "
                 "{:.3f} / {:.3f} ms)\n",
                 S, d.fig("fwd_tflops"), d.fig("bwd_tflops"), d.fig("fwd_ms"), d.fig("bwd_ms"), d.fig("model_fwd_ms"),
                 d.fig("model_bwd_ms"));
      csv.push_back(fmt::format("dsa_mla_index,{},,,{:.2f},{:.2f},,,,,,,0,{:.3f},{:.3f},,", S, d.fig("fwd_tflops"),
                                d.fig("bwd_tflops"),
                                d.fig("model_fwd_ms") > 0 ? d.fig("fwd_ms") / d.fig("model_fwd_ms") : 0.0,
                                d.fig("model_bwd_ms") > 0 ? d.fig("bwd_ms") / d.fig("model_bwd_ms") : 0.0));
    } catch (const std::exception& e) {
      fmt::print("\nDSA index kernels (S = {}): FAILED: {}\n", S, e.what());
      ++failed;
    }
  }
  if (!csv_path.empty()) {
    std::ofstream f(csv_path);
    for (const auto& line : csv) f << line << "\n";
    fmt::print("wrote {}\n", csv_path);
  }
  return failed == 0 ? 0 : 1;
}
