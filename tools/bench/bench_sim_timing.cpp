// Speed of the sim executor's timing mode (metadata only): the standard
// workload (causal_document packs from the histogram, 8192 tokens per rank,
// GQA 64:8 flattened, D = 128, bf16) up to P = 1024, S = 8M tokens. Prints, per
// solver and P, the time of solve, build_plan and the executor's timing run
// (report and chart included), the median of estimate_step (what a solver calls
// per candidate plan; its cost:
// docs/bounds.md#measurements-behind-code-constants) and of simulate_timeline
// (with per-op records), the plan's size (destination entries of all
// collectives) and the simulated step time and step / compute bound.
//
//   bench_sim_timing [--cp 8,64,256,1024] [--solvers owner,usp,binary_greedy] [--hardware NAME|FILE]
//                    [--stages N] [--repeats R] [--data-dir DIR]
#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_common.hpp"
#include "cpsched/base/stopwatch.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/session/solve_path.hpp"
#include "cpsched/plugin/registry.hpp"
#include "cpsched/timing/model.hpp"

using namespace cpsched;

namespace {

// Destination and source entries of every collective of both passes: the
// size the simulation is linear in.
long long plan_entries(const Plan& plan) {
  long long n = 0;
  for (const RankPlan& r : plan.ranks)
    for (const PassPlan* pp : {&r.fwd, &r.bwd})
      for (const StageComm& sc : pp->comm.stages)
        for (const GroupCollectiveArg* a : {&sc.qo, &sc.kv}) {
          for (const auto& d : a->dst_indices) n += static_cast<long long>(d.size());
          n += static_cast<long long>(a->src_index.size());
        }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> cps = {"8", "64", "256", "1024"}, solvers = {"owner", "usp", "binary_greedy"};
    std::string hardware = kDefaultHardwareProfile;
    int stages = 1, repeats = 9;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string k = argv[i], v = argv[i + 1];
      if (k == "--cp") cps = bench::split(v);
      else if (k == "--solvers") solvers = bench::split(v);
      else if (k == "--hardware") hardware = v;
      else if (k == "--stages") stages = std::stoi(v);
      else if (k == "--repeats") repeats = std::max(1, std::stoi(v));
      else if (k != "--data-dir") throw Error("bench_sim_timing: unknown option " + k);
    }
    Registry reg;
    reg.scan_default_folders();
    const PluginInfo& sim = reg.find(PluginKind::executor, "sim");
    auto executor = reg.make_executor("sim", reg.resolve_params(sim, Params({{"mode", std::string("timing")},
                                                                            {"hardware", hardware}})));
    AreaCostModel cost;
    MaskSpec spec;
    spec.kind = MaskKind::causal_document;
    spec.histogram = DocHistogram::load_csv(bench::data_file(argc, argv, "doc_length_distribution.csv"));
    fmt::print("sim timing mode, hardware {}, causal_document pack 0, 8192 tokens/rank, 64:8, D 128, stages {}\n",
               hardware, stages);
    const HardwareProfile hw = resolve_hardware_profile(hardware);
    fmt::print("{:>14} {:>5} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>10}\n", "solver", "P", "solve ms",
               "plan ms", "sim ms", "est ms", "tl ms", "entries", "step ms", "/bound", "fwd exp ms");
    for (const std::string& cp : cps) {
      const int P = std::stoi(cp);
      const Token S = Token{8192} * P;
      auto problem = std::make_shared<const Problem>(Problem::make(make_mask(spec, S), P, Heads{64, 8, 128, 2}));
      auto grid = std::make_shared<const TaskGrid>(problem);
      for (const std::string& name : solvers) {
        const PluginInfo& info = reg.find(PluginKind::solver, name);
        auto solver = reg.make_solver(name, reg.resolve_params(info, {}));
        const SolveResult r = SolvePath(*solver, cost, reg).run(grid, {.shape = PlanShape::fixed(stages), .uses = std::nullopt, .validate = false, .rank = -1, .solver_name = name});
        const Assignment& a = *r.assignment;
        const Plan& plan = *r.plan;
        const double solve_ms = r.solve_ms, plan_ms = r.plan_ms;
        auto t0 = std::chrono::steady_clock::now();
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
        TimingWorkspace ws;
        StepEstimate est;
        const double est_ms = bench::median_ms(repeats, [&] { est = estimate_step(*problem, plan, hw, ws); });
        const double tl_ms = bench::median_ms(std::max(1, repeats / 3), [&] {
          const Timeline tl = simulate_timeline(*problem, plan, hw);
          if (tl.fwd.makespan() != est.fwd) throw Error("bench_sim_timing: estimate_step differs from the timeline");
        });
        fmt::print("{:>14} {:>5} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.3f} {:>10.3f} {:>10} {:>10.3f} {:>8.3f} {:>10.3f}\n",
                   name, P, solve_ms, plan_ms, sim_ms, est_ms, tl_ms, plan_entries(plan), step, est.ratio(), exposed);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_sim_timing: {}\n", e.what());
    return 1;
  }
}
