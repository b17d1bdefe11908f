// Speed of the sim executor's timing mode (metadata only): the standard
// workload (causal_document packs from the histogram, 8192 tokens per rank,
// GQA 64:8 flattened, D = 128, bf16) up to P = 1024, S = 8M tokens. Prints,
// per solver and P, the time of solve, build_plan and the executor's timing
// run, and the simulated step time. The timing run should take well under a
// second even at P = 1024.
//
//   bench_sim_timing [--cp 8,64,256,1024] [--solvers owner,usp,binary_greedy] [--hardware NAME|FILE]
//                    [--stages N] [--data-dir DIR]
#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_common.hpp"
#include "cpsched/error.hpp"
#include "cpsched/mask_generators.hpp"
#include "cpsched/plan_builder.hpp"
#include "cpsched/registry.hpp"

using namespace cpsched;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> cps = {"8", "64", "256", "1024"}, solvers = {"owner", "usp", "binary_greedy"};
    std::string hardware = "h100_8x_nvlink";
    int stages = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string k = argv[i], v = argv[i + 1];
      if (k == "--cp") cps = bench::split(v);
      else if (k == "--solvers") solvers = bench::split(v);
      else if (k == "--hardware") hardware = v;
      else if (k == "--stages") stages = std::stoi(v);
      else if (k != "--data-dir") throw Error("bench_sim_timing: unknown option " + k);
    }
    Registry reg;
    reg.scan(Registry::default_plugin_dir());
    const PluginInfo& sim = reg.find(PluginKind::executor, "sim");
    auto executor = reg.make_executor("sim", reg.resolve_params(sim, Params({{"mode", std::string("timing")},
                                                                            {"hardware", hardware}})));
    AreaCostModel cost;
    MaskSpec spec;
    spec.kind = MaskKind::causal_document;
    spec.histogram = DocHistogram::load_csv(bench::data_file(argc, argv, "doc_length_distribution.csv"));
    fmt::print("sim timing mode, hardware {}, causal_document pack 0, 8192 tokens/rank, 64:8, D 128, stages {}\n",
               hardware, stages);
    fmt::print("{:>14} {:>5} {:>10} {:>10} {:>10} {:>12} {:>12}\n", "solver", "P", "solve ms", "plan ms", "sim ms",
               "step ms", "fwd exp ms");
    for (const std::string& cp : cps) {
      const int P = std::stoi(cp);
      const Token S = Token{8192} * P;
      auto problem = std::make_shared<const Problem>(Problem::make(make_mask(spec, S), P, Heads{64, 8, 128, 2}));
      auto grid = std::make_shared<const TaskGrid>(problem);
      for (const std::string& name : solvers) {
        const PluginInfo& info = reg.find(PluginKind::solver, name);
        auto solver = reg.make_solver(name, reg.resolve_params(info, {}));
        auto t0 = std::chrono::steady_clock::now();
        const Assignment a = solver->solve(SolveInput{grid, &cost});
        const double solve_ms = ms_since(t0);
        t0 = std::chrono::steady_clock::now();
        const Plan plan = build_plan(a, stages);
        const double plan_ms = ms_since(t0);
        ExecuteInput in;
        in.problem = problem;
        in.grid = a.grid;
        in.assignment = &a;
        in.plan = &plan;
        t0 = std::chrono::steady_clock::now();
        const ExecutionReport rep = executor->execute(in);
        const double sim_ms = ms_since(t0);
        double step = 0, exposed = 0;
        for (const auto& [k, v] : rep.figures) {
          if (k == "step_time_ms") step = v;
          if (k == "fwd_exposed_comm_max_ms") exposed = v;
        }
        fmt::print("{:>14} {:>5} {:>10.2f} {:>10.2f} {:>10.2f} {:>12.3f} {:>12.3f}\n", name, P, solve_ms, plan_ms,
                   sim_ms, step, exposed);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_sim_timing: {}\n", e.what());
    return 1;
  }
}
