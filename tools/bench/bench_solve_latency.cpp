// Solve latency of a solver plugin, whole path as a user runs it (docs/design.md#benchmark-of-record):
// TaskGrid construction + solve + compute_metrics, 8192 tokens per rank,
// masks full / causal / full_document / causal_document (pack 0 of the bundled
// histogram), GQA 64:8 and MHA 64:64 flattened, P = 8 ... 128. The solver is
// loaded through the Registry from the build's plugin folder.
//
//   bench_solve_latency [--solver binary_greedy] [--repeats 7] [--threads N]
//                       [--max-p 128] [--only-p P] [--only-mask KIND] [--only-kv HKV]
//                       [--data-dir DIR]
#include <fmt/format.h>

#include <cstdlib>
#include <ctime>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/session/solve_path.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/plugin/registry.hpp"

using namespace cpsched;

namespace {

// The targets on a 2-core machine (ms); 0: none.
double target_ms(int kv_heads, int P, MaskKind m) {
  if (kv_heads == 8 && P == 64) return 10.0;
  if (kv_heads == 8 && P == 128 && m == MaskKind::causal_document) return 40.0;
  if (kv_heads == 64 && P == 32) return 30.0;
  return 0.0;
}

// CPU time of the whole process (all threads), ms: on a shared machine it
// shows the work done when the wall clock also counts waiting for a core.
double process_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) try {
  bench::check_args(argc, argv, "bench_solve_latency", {"--solver", "--repeats", "--max-p", "--threads", "--only-p", "--only-kv", "--only-mask"});
  const std::string solver_name = bench::arg(argc, argv, "--solver", "binary_greedy");
  const int repeats = std::max(5, std::atoi(bench::arg(argc, argv, "--repeats", "7").c_str()));
  const int max_p = std::atoi(bench::arg(argc, argv, "--max-p", "128").c_str());
  const std::string threads = bench::arg(argc, argv, "--threads", "");
  const int only_p = std::atoi(bench::arg(argc, argv, "--only-p", "0").c_str());
  const int only_kv = std::atoi(bench::arg(argc, argv, "--only-kv", "0").c_str());
  const std::string only_mask = bench::arg(argc, argv, "--only-mask", "");
  const auto hist = DocHistogram::load_csv(bench::data_file(argc, argv, "doc_length_distribution.csv"));

  Registry reg;
  reg.scan_default_folders();
  Params given;
  if (!threads.empty()) given.set("threads", std::int64_t{std::atoi(threads.c_str())});
  auto solver = reg.make_solver(solver_name, reg.resolve_params(reg.find(PluginKind::solver, solver_name), given));
  auto cost = reg.make_cost_model("area", reg.resolve_params(reg.find(PluginKind::cost_model, "area"), {}));

  fmt::print("solve latency of `{}`: whole path = TaskGrid + solve + compute_metrics, median of {} repeats\n",
             solver_name, repeats);
  fmt::print("8192 tokens/rank, D = 128, bf16, head groups flattened, document masks: pack 0, seed 42\n");
  fmt::print("solver threads: {} (hardware threads here: {})\n\n", threads.empty() ? "default" : threads,
             std::thread::hardware_concurrency());
  fmt::print("{:>6} {:>4} {:>16} {:>7} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6}  {}\n", "heads", "P", "mask",
             "cells", "tasks", "grid ms", "solve ms", "metr ms", "total ms", "cpu ms", "imbal", "target");
  int missed = 0;
  for (const Heads heads : {Heads{64, 8, 128, 2}, Heads{64, 64, 128, 2}}) {
    if (only_kv != 0 && heads.kv != only_kv) continue;
    for (int P : {8, 16, 32, 64, 128}) {
      if (P > max_p || (only_p != 0 && P != only_p)) continue;
      for (MaskKind kind : {MaskKind::full, MaskKind::causal, MaskKind::full_document, MaskKind::causal_document}) {
        if (!only_mask.empty() && to_string(kind) != only_mask) continue;
        MaskSpec spec;
        spec.kind = kind;
        if (kind == MaskKind::full_document || kind == MaskKind::causal_document) spec.histogram = hist;
        const Token S = Token{8192} * P;
        auto problem = std::make_shared<const Problem>(Problem::make(make_mask(spec, S), P, heads));
        std::vector<double> t_grid, t_solve, t_metrics, t_total, t_cpu;
        std::size_t cells = 0;
        TaskId tasks = 0;
        double imbalance = 0.0;
        bool feasible = true;
        for (int rep = 0; rep < repeats; ++rep) {
          using clock = std::chrono::steady_clock;
          const double c0 = process_cpu_ms();
          const auto t0 = clock::now();
          auto grid = std::make_shared<const TaskGrid>(problem);
          const auto t1 = clock::now();
          const Solution sol = SolvePath(*solver, *cost, reg).solve(grid, PlanShape{});
          const auto t2 = clock::now();
          Metrics m = compute_metrics(sol.assignment);
          const auto t3 = clock::now();
          t_cpu.push_back(process_cpu_ms() - c0);
          auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
          t_grid.push_back(ms(t1 - t0));
          t_solve.push_back(ms(t2 - t1));
          t_metrics.push_back(ms(t3 - t2));
          t_total.push_back(ms(t3 - t0));
          cells = grid->cells().size();
          tasks = grid->num_tasks();
          imbalance = m.imbalance;
          feasible = sol.feasible;
        }
        const double total = median(t_total);
        const double target = target_ms(heads.kv, P, kind);
        std::string verdict;
        if (target > 0.0) {
          verdict = fmt::format("<= {:.0f} ms: {}", target, total <= target ? "pass" : "FAIL");
          if (total > target) ++missed;
        }
        fmt::print("{:>6} {:>4} {:>16} {:>7} {:>8} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>6.3f}{} {}\n",
                   fmt::format("{}:{}", heads.q, heads.kv), P, to_string(kind), cells, tasks, median(t_grid),
                   median(t_solve), median(t_metrics), total, median(t_cpu), imbalance, feasible ? " " : "*",
                   verdict);
        std::fflush(stdout);
      }
    }
  }
  fmt::print("\n(* = the solver reported the balance target infeasible; targets apply to the wall-clock total;\n"
             " cpu ms = process CPU time of the whole path, all threads, a load-independent view)\n");
  fmt::print("{}\n", missed == 0 ? "all latency targets met" : fmt::format("{} latency target(s) missed", missed));
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_solve_latency: {}\n", e.what());
  return 1;
}
