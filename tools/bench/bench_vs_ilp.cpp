// Forward bytes of every solver against the exact `ilp` solver, and the
// default solver's targets checked on them (printed last): 8192 tokens per
// rank, GQA 64:8 flattened, D = 128, bf16, mu = 1.10, masks full, causal and
// the 20 full_document / causal_document packs (seed 42) of the bundled
// histogram; P = 8 ... 128, ilp where P <= --ilp-max-p.
//
// Per (P, mask) it prints the mean forward total send of each solver (GiB), the
// largest imbalance, the gap of each solver to ilp's incumbent and to ilp's
// proven bound, how many ilp runs proved optimality, the median solve time,
// and how often `--solver` (default balanced_bytes) moved more bytes than the
// best of usp, owner and binary_greedy (all of them / those meeting mu).
//
//   bench_vs_ilp [--p 8,16,32,64,128] [--masks full,causal,full_document,causal_document]
//                [--packs 20] [--ilp-max-p 8] [--ilp-time 10] [--solver balanced_bytes]
//                [--threads N] [--only usp,ilp,...] [--first-pack K] [--data-dir DIR] [--verbose]
//                [--param solver:name=value]... (parameter overrides, e.g. balanced_bytes:effort=100000)
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/session/solve_path.hpp"
#include "cpsched/plugin/cost_model.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/plugin/registry.hpp"

using namespace cpsched;

namespace {

struct Run {
  double fwd = 0;        // forward total send, bytes
  double imbalance = 0;
  bool meets_mu = false;
  double ms = 0;         // solve time, wall clock
  double cpu_ms = 0;     // solve time, process CPU (all threads): load-independent
  double bound = -1;     // ilp only
  bool optimal = false;  // ilp only
};

double cpu_now_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMu = 1.10;

}  // namespace

int main(int argc, char** argv) try {
  bench::check_args(argc, argv, "bench_vs_ilp", {"--p", "--masks", "--packs", "--ilp-max-p", "--ilp-time", "--solver", "--threads", "--only", "--first-pack", "--param"}, {"--verbose"});
  std::vector<int> ps;
  for (const auto& s : bench::split(bench::arg(argc, argv, "--p", "8,16,32,64,128"))) ps.push_back(std::atoi(s.c_str()));
  const auto masks = bench::split(bench::arg(argc, argv, "--masks", "full,causal,full_document,causal_document"));
  const int packs = std::atoi(bench::arg(argc, argv, "--packs", "20").c_str());
  const int ilp_max_p = std::atoi(bench::arg(argc, argv, "--ilp-max-p", "8").c_str());
  const std::string ilp_time = bench::arg(argc, argv, "--ilp-time", "10");
  const std::string main_solver = bench::arg(argc, argv, "--solver", "balanced_bytes");
  const std::string threads = bench::arg(argc, argv, "--threads", "");
  const bool verbose = bench::flag(argc, argv, "--verbose");
  const auto only = bench::split(bench::arg(argc, argv, "--only", ""));
  const int first_pack = std::atoi(bench::arg(argc, argv, "--first-pack", "0").c_str());
  const auto hist = DocHistogram::load_csv(bench::data_file(argc, argv, "doc_length_distribution.csv"));

  Registry reg;
  reg.scan_default_folders();
  const std::vector<std::string> refs = {"usp", "owner", "binary_greedy"};
  std::vector<std::string> names = refs;
  names.push_back(main_solver);
  names.push_back("ilp");
  std::map<std::string, std::unique_ptr<Solver>> solvers;
  for (const auto& name : names) {
    if (!only.empty() && std::find(only.begin(), only.end(), name) == only.end()) continue;
    const PluginInfo* info = nullptr;
    for (const auto& p : reg.plugins())
      if (p.kind == PluginKind::solver && p.name == name) info = &p;
    if (info == nullptr) {
      fmt::print("solver `{}` not found in {}: left out\n", name, Registry::default_plugin_dir().string());
      continue;
    }
    Params given;
    for (int i = 1; i + 1 < argc; ++i) {
      if (std::string(argv[i]) != "--param") continue;
      const std::string kv = argv[i + 1];
      const auto colon = kv.find(':'), eq = kv.find('=');
      if (colon == std::string::npos || eq == std::string::npos || eq < colon)
        throw Error("--param wants solver:name=value, got '" + kv + "'");
      if (kv.substr(0, colon) != name) continue;
      const std::string key = kv.substr(colon + 1, eq - colon - 1);
      for (const auto& spec : info->params) {
        if (spec.name != key) continue;
        ParamValue v;
        if (!parse_param(kv.substr(eq + 1), spec.type, v)) throw Error("--param " + kv + ": not a " + std::string(to_string(spec.type)));
        given.set(key, v);
      }
    }
    for (const auto& spec : info->params) {
      if (given.has(spec.name)) continue;
      if (spec.name == "mu") given.set("mu", kMu);
      if (spec.name == "threads" && !threads.empty()) given.set("threads", std::int64_t{std::atoi(threads.c_str())});
      if (spec.name == "time_limit_s") given.set("time_limit_s", std::atof(ilp_time.c_str()));
    }
    solvers[name] = reg.make_solver(name, reg.resolve_params(*info, given));
  }
  const AreaCostModel cost;

  fmt::print("forward total send against ilp: 8192 tokens/rank, GQA 64:8 flattened, D 128, bf16, mu {:.2f}\n", kMu);
  fmt::print("document masks: packs {}..{} of the bundled histogram, seed 42; ilp time limit {} s per instance\n\n",
             first_pack, first_pack + packs - 1, ilp_time);
  fmt::print("{:>4} {:>16} {:>3}  {:>22} {:>22} {:>22} {:>22} {:>11} {:>11} {:>7}  {:>8} {:>8} {:>9} {:>7}  {:>9}\n", "P",
             "mask", "n", "usp GiB (max imb)", "owner GiB (max imb)", "bg GiB (max imb)",
             fmt::format("{} GiB (max imb)", main_solver.substr(0, 8)), "ilp GiB", "ilp bound", "proven",
             "gap ilp", "gap bnd", "ms (med)", "cpu ms", "> best");
  std::vector<std::string> verdicts;
  int failed = 0;
  auto verdict = [&](bool ok, const std::string& what) {
    verdicts.push_back(fmt::format("  {}  {}", ok ? "pass" : "FAIL", what));
    failed += ok ? 0 : 1;
  };
  for (int P : ps) {
    for (const auto& mask_name : masks) {
      MaskKind kind;
      if (!parse_mask_kind(mask_name, kind)) throw Error("unknown mask kind '" + mask_name + "'");
      const bool docs = kind == MaskKind::full_document || kind == MaskKind::causal_document;
      const int n = docs ? packs : 1;
      std::map<std::string, std::vector<Run>> runs;
      int worse_any = 0, worse_feasible = 0;
      for (int pack = first_pack; pack < first_pack + n; ++pack) {
        MaskSpec spec;
        spec.kind = kind;
        spec.pack = pack;
        spec.seed = 42;
        if (docs) spec.histogram = hist;
        const Token S = Token{8192} * P;
        auto problem = std::make_shared<const Problem>(Problem::make(make_mask(spec, S), P, Heads{64, 8, 128, 2}));
        auto grid = std::make_shared<const TaskGrid>(problem);
        for (auto& [name, solver] : solvers) {
          if (name == "ilp" && P > ilp_max_p) continue;
          const double c0 = cpu_now_ms();
          const auto t0 = std::chrono::steady_clock::now();
          const Solution sol = SolvePath(*solver, cost, reg).solve(grid, PlanShape{});
          const double ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          const double cpu = cpu_now_ms() - c0;
          const Metrics m = compute_metrics(sol.assignment);
          Run r{static_cast<double>(m.fwd.total_send), m.imbalance, m.imbalance <= kMu, ms, cpu};
          if (name == "ilp") {
            r.bound = sol.figures.get("bound_bytes").value_or(-1.0);
            r.optimal = sol.figures.get("proven").value_or(0.0) != 0.0;
          }
          if (verbose)
            fmt::print("  P {} {} pack {} {}: {:.4f} GiB (bottleneck {:.4f} GiB) imb {:.3f} {:.1f} ms | {}\n", P, mask_name,
                       pack, name, r.fwd / kGiB, static_cast<double>(m.fwd.bottleneck) / kGiB, r.imbalance, ms, sol.note);
          runs[name].push_back(r);
        }
        if (runs.count(main_solver) != 0) {
          const Run& me = runs[main_solver].back();
          double best_any = 1e300, best_ok = 1e300;
          for (const auto& ref : refs) {
            if (runs.count(ref) == 0) continue;
            const Run& o = runs[ref].back();
            best_any = std::min(best_any, o.fwd);
            if (o.meets_mu) best_ok = std::min(best_ok, o.fwd);
          }
          worse_any += me.fwd > best_any;
          worse_feasible += me.fwd > best_ok;
        }
      }
      auto mean = [&](const std::string& name, double Run::*field) {
        const auto& v = runs[name];
        double s = 0;
        for (const Run& r : v) s += r.*field;
        return v.empty() ? -1.0 : s / static_cast<double>(v.size());
      };
      auto cellv = [&](const std::string& name) -> std::string {
        if (runs[name].empty()) return "-";
        double imb = 0;
        for (const Run& r : runs[name]) imb = std::max(imb, r.imbalance);
        return fmt::format("{:.4f} ({:.3f})", mean(name, &Run::fwd) / kGiB, imb);
      };
      const bool have_ilp = !runs["ilp"].empty();
      int proven = 0;
      for (const Run& r : runs["ilp"]) proven += r.optimal;
      const double me = mean(main_solver, &Run::fwd);
      const double ilp = have_ilp ? mean("ilp", &Run::fwd) : -1;
      const double bnd = have_ilp ? mean("ilp", &Run::bound) : -1;
      std::vector<double> ms, cpu;
      for (const Run& r : runs[main_solver]) {
        ms.push_back(r.ms);
        cpu.push_back(r.cpu_ms);
      }
      std::sort(ms.begin(), ms.end());
      std::sort(cpu.begin(), cpu.end());
      fmt::print("{:>4} {:>16} {:>3}  {:>22} {:>22} {:>22} {:>22} {:>11} {:>11} {:>7}  {:>8} {:>8} {:>9.2f} {:>7.2f}  {:>4}/{:<4}\n",
                 P, mask_name, n, cellv("usp"), cellv("owner"), cellv("binary_greedy"), cellv(main_solver),
                 have_ilp ? fmt::format("{:.4f}", ilp / kGiB) : "-", have_ilp ? fmt::format("{:.4f}", bnd / kGiB) : "-",
                 have_ilp ? fmt::format("{}/{}", proven, n) : "-",
                 have_ilp ? fmt::format("{:+.2f}%", 100.0 * (me / ilp - 1.0)) : "-",
                 have_ilp ? fmt::format("{:+.2f}%", 100.0 * (me / bnd - 1.0)) : "-", ms.empty() ? 0.0 : ms[ms.size() / 2],
                 cpu.empty() ? 0.0 : cpu[cpu.size() / 2], worse_any, worse_feasible);
      std::fflush(stdout);
      // The default solver's targets against ilp and the cheap solvers.
      if (runs[main_solver].empty()) continue;
      double max_imb = 0;
      for (const Run& r : runs[main_solver]) max_imb = std::max(max_imb, r.imbalance);
      const std::string where = fmt::format("P {} {}", P, mask_name);
      verdict(max_imb <= kMu, fmt::format("{}: imbalance {:.4f} <= {:.2f} on every mask", where, max_imb, kMu));
      if (P == 8 && docs && have_ilp)
        verdict(me <= 1.05 * ilp, fmt::format("{}: mean send {:+.2f}% of ilp's incumbent (<= +5%; {:+.2f}% of its bound, "
                                              "{}/{} proven)", where, 100.0 * (me / ilp - 1.0),
                                              100.0 * (me / bnd - 1.0), proven, n));
      if (P >= 16)
        verdict(worse_feasible == 0, fmt::format("{}: never more bytes than the best of usp, owner, binary_greedy "
                                                 "meeting mu ({} of {} masks more)", where, worse_feasible, n));
      if (P == 64 && !cpu.empty())
        verdict(cpu[cpu.size() / 2] <= 10.0, fmt::format("{}: median solve CPU time {:.2f} ms <= 10 ms (wall {:.2f} ms "
                                                         "on this machine's load)", where, cpu[cpu.size() / 2],
                                                         ms[ms.size() / 2]));
    }
  }
  fmt::print("\ngap ilp / gap bnd: mean {} send over mean ilp incumbent / mean ilp proven bound, minus 1\n", main_solver);
  fmt::print("ms, cpu ms: median solve time of {} (wall clock; process CPU time, all threads)\n", main_solver);
  fmt::print("> best: packs where {} sent more than the best of usp, owner, binary_greedy (all / those meeting mu)\n",
             main_solver);
  fmt::print("\ntargets for {}:\n", main_solver);
  for (const auto& v : verdicts) fmt::print("{}\n", v);
  fmt::print("{}\n", failed == 0 ? "all targets met" : fmt::format("{} target(s) missed", failed));
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_vs_ilp: {}\n", e.what());
  return 1;
}
