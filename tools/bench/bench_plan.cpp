// Plan building latency (docs/design.md#benchmark-of-record workload at P = 64): GQA 64:8 flattened,
// causal_document packs from the histogram, 8192 tokens per rank. Targets on
// the 2-core reference machine: build_plan < 5 ms, a plan-cache hit < 0.1 ms.
//
//   bench_plan [--histogram FILE] [--cp N] [--repeats N] [--pack N] [--mask KIND]
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cpsched/plan/builder.hpp"
#include "cpsched/session/solve_path.hpp"
#include "cpsched/session/session.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"

using namespace cpsched;
namespace fs = std::filesystem;

namespace {

template <class F>
double time_ms(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The histogram of the repository, looked up from the program's folder and the
// working folder upwards.
fs::path find_histogram() {
  const fs::path rel = fs::path("configs") / "data" / "doc_length_distribution.csv";
  std::vector<fs::path> starts{fs::current_path()};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) starts.push_back(exe.parent_path());
  for (fs::path d : starts)
    for (; !d.empty(); d = d.parent_path()) {
      if (fs::exists(d / rel)) return d / rel;
      if (d == d.parent_path()) break;
    }
  throw Error("bench_plan: cannot find configs/data/doc_length_distribution.csv; pass --histogram FILE");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    fs::path histogram;
    int P = 64, repeats = 21, pack = 0;
    MaskKind kind = MaskKind::causal_document;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string k = argv[i];
      if (k == "--histogram") histogram = argv[i + 1];
      else if (k == "--cp") P = std::stoi(argv[i + 1]);
      else if (k == "--repeats") repeats = std::max(1, std::stoi(argv[i + 1]));
      else if (k == "--pack") pack = std::stoi(argv[i + 1]);
      else if (k == "--mask") {
        if (!parse_mask_kind(argv[i + 1], kind)) throw Error(fmt::format("bench_plan: unknown mask kind '{}'", argv[i + 1]));
      }
      else throw Error("bench_plan: unknown option " + k);
    }
    if (histogram.empty()) histogram = find_histogram();

    const Token S = Token{P} * 8192;
    MaskSpec spec;
    spec.kind = kind;
    spec.histogram = DocHistogram::load_csv(histogram);
    spec.seed = 42;
    spec.pack = pack;
    const RangeMask mask = make_mask(spec, S);
    const Heads heads{64, 8, 128, 2};
    auto problem = std::make_shared<const Problem>(Problem::make(mask, P, heads, {true, 1}));
    std::shared_ptr<const TaskGrid> grid;
    const double grid_ms = time_ms([&] { grid = std::make_shared<const TaskGrid>(problem); });
    fmt::print("bench_plan: P = {}, S = {}, GQA 64:8 flattened, {} pack {} ({} slices), {} cells, "
               "{} tasks; grid {:.2f} ms; median of {} repeats\n",
               P, S, to_string(kind), pack, mask.slices().size(), grid->cells().size(), grid->num_tasks(), grid_ms, repeats);

    auto reg = std::make_shared<Registry>();
    reg->scan_default_folders();
    AreaCostModel cost;

    fmt::print("{:<14} {:>6} {:>9} {:>10} {:>10} {:>9} {:>11} {:>12} {:>10}\n", "solver", "stages", "solve ms",
               "plan ms", "validate", "args", "splits", "fwd GiB", "cache hit");
    for (const std::string name : {"owner", "binary_greedy", "usp"}) {
      bool found = false;
      for (const PluginInfo& p : reg->plugins()) found |= p.kind == PluginKind::solver && p.name == name;
      if (!found) {
        fmt::print("{:<14} (not built)\n", name);
        continue;
      }
      auto solver = reg->make_solver(name, reg->resolve_params(reg->find(PluginKind::solver, name), {}));
      Assignment a;
      const double solve_ms = time_ms([&] { a = SolvePath(*solver, cost, *reg).solve(grid, PlanShape{}).assignment; });
      for (int stages : {1, 4}) {
        std::vector<double> t;
        Plan plan;
        for (int r = 0; r < repeats; ++r) t.push_back(time_ms([&] { plan = build_plan(a, stages); }));
        std::vector<std::string> problems;
        const double val_ms = time_ms([&] { problems = validate_plan(a, plan); });
        std::size_t args = 0, splits = 0;
        for (const RankPlan& rp : plan.ranks) {
          args += rp.fwd.calc.local_attn_args.size();
          for (const auto& s : rp.fwd.calc.remote_attn_args) args += s.size();
          for (const auto& s : rp.fwd.comm.stages) splits += s.qo.input_split_sizes.size() + s.kv.input_split_sizes.size();
        }
        // Cache hit: the whole Session::solve path for a mask seen before.
        SessionOptions o;
        o.cp_size = P;
        o.seqlen = S;
        o.heads = heads;
        o.solver = name;
        o.plan.stages = stages;
        Session session(o, reg);
        session.solve(mask);
        std::vector<double> hit;
        for (int r = 0; r < std::max(repeats, 101); ++r) {
          session.solve(mask);
          if (!session.last_was_cached()) throw Error("bench_plan: expected a cache hit");
          hit.push_back(session.last_call_ms());
        }
        fmt::print("{:<14} {:>6} {:>9.2f} {:>10.3f} {:>8.1f}ms {:>9} {:>11} {:>12.3f} {:>8.4f}ms{}\n", name, stages,
                   solve_ms, median(t), val_ms, args, splits,
                   static_cast<double>(compute_metrics(a).fwd.total_send) / (1 << 30), median(hit),
                   problems.empty() ? "" : "  INVALID PLAN");
      }
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_plan: {}\n", e.what());
    return 1;
  }
}
