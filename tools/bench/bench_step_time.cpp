// Step time against the compute bound (docs/design.md, "Benchmark of record"):
// for every hardware profile x mask x P, every solver plans each of the seed-42
// packs (8192 tokens per rank, GQA 64:8, D 128, bf16, flattened head groups),
// the plan is priced by the timing model (fwd + bwd), and the program prints
// the mean step / compute bound over the packs, the median whole-path latency
// (grid + solve + plan), and how often the first solver (the default) is more
// than 1 % slower than the best of the others on a pack.
//
//   bench_step_time [--hardware h100_8x_nvlink,cluster_8gpu_ib] [--cp 8,16,32,64,128]
//                   [--masks full,causal,full_document,causal_document] [--packs 20]
//                   [--solvers balanced_bytes,binary_greedy,usp,static,owner]
//                   [--stages N|auto] [--relay off|on|auto] [--layout planned|fixed]
//                   [--uses N|ahead] [--rank R] [--per-pack] [--data-dir DIR]
// --layout as problem.layout (planned: the solver may re-lay out the tokens;
// fixed: sequential shards, what a per-layer mask needs); a solver that
// refuses the layout (static under fixed) prints "-". --uses as plan.uses
// (default: by the layout) adds, when a number, the cost per use
// (path / uses + step) / bound. --rank builds that rank's plan only, so the
// latency is one rank's whole path.
// Stages and relays as plan.stages / plan.relay: `auto` lets a solver choose
// (balanced_bytes does; the others plan 1 stage without relays).
// --per-pack prints each pack's step of the first solver and every other's
// step over it.
// The first solver gets the `time` cost model, the others the seed's `area`
// (a suffix @time or @area overrides). A solver may carry parameters, typed by
// its schema: `balanced_bytes:objective=bytes+mu=1.05`.
//
// --kernel-compare (docs/bounds.md, "Plans priced as the kernels run them"):
// for each profile with a kernel model, the first solver plans every pack
// twice, on the profile without its kernel table (today's plans, "old") and
// with it ("new"), and both plans are priced with it. Per (mask, P): the mean
// step / bound of old priced without the table, old and new priced with it (the
// bound: the exact area at attention_tflops), new / old per pack (mean, min,
// max), what tiles cost old (its step with tiles over its step on exact areas
// at the same rates) and what they cost the mask's own args (uncut: one rank,
// one block), the packs where new is slower than old, the packs where tiles
// cost old more than 5 % and new is not at least 2 % faster, the mean blocks
// per rank of both plans' grids (old / new: the fixed layout's finer grids),
// and the median whole-path latency of both solves (with --rank, that rank's
// whole path; --repeat N solves each plan N times per pack, old and new
// alternating, for more latency samples); --notes prints each pack's two solver
// notes.
#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_common.hpp"
#include "standard_workload.hpp"
#include "cpsched/base/stopwatch.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/session/solve_path.hpp"
#include "cpsched/plugin/registry.hpp"
#include "cpsched/timing/model.hpp"
#include "cpsched/plugin/cost_model.hpp"
#include "cpsched/hardware/task_kernel.hpp"

using namespace cpsched;

namespace {

struct SolverSpec {
  std::string label;        // as given: "name:param=value+param=value" (params.hpp's spec syntax)
  bool time_cost = false;   // given the time cost model (else the seed's area)
};

SolverSpec parse_solver(std::string s, bool first) {
  SolverSpec spec{s, first};
  if (s.ends_with("@time") || s.ends_with("@area")) spec.time_cost = s.ends_with("@time");
  return spec;
}

// The spec without its @time / @area suffix.
std::string plugin_spec(const SolverSpec& s) {
  return s.label.ends_with("@time") || s.label.ends_with("@area") ? s.label.substr(0, s.label.size() - 5) : s.label;
}

// What tiles cost the mask itself: its slices' args uncut (one rank, one
// block), priced with tiles over priced on their exact areas, fwd + bwd.
double mask_tile_cost(const Problem& p, const HardwareProfile& hw, const HardwareProfile& area) {
  Problem one = Problem::make(p.mask, 1, p.heads, p.grid.flatten_head_groups ? GridOptions{true, 1} : GridOptions{false, 1});
  const TaskGrid grid(std::make_shared<const Problem>(std::move(one)));
  const auto with = task_kernel_seconds(grid, hw), without = task_kernel_seconds(grid, area);
  double a = 0, b = 0;
  for (TaskId t = 0; t < grid.num_tasks(); ++t) {
    a += with->both[with->unit_of(t)];
    b += without->both[without->unit_of(t)];
  }
  return b > 0 ? a / b : 1.0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct CompareArgs {
  std::vector<std::string> hardware, cps, masks;
  int packs = 20;
  std::string solver;
  PlanShape shape;
  Layout layout = Layout::planned;
  std::optional<PlanUses> uses;
  Rank rank = -1;      // >= 0: the solves build that rank's plan only (its whole path is the latency)
  int repeat = 1;      // solves of each plan per pack, alternating old and new (latency samples)
  bool notes = false;  // each pack's two solver notes
};

// --kernel-compare (see the file comment).
void kernel_compare(Registry& reg, const DocHistogram& hist, const CompareArgs& c) {
  fmt::print("kernel compare: {} plans made on the profile without its kernel table (old) and with it (new), both "
             "priced with it; step / bound (bound: exact area at attention_tflops), mean over packs; layout {}, uses {}\n",
             c.solver, c.layout == Layout::fixed ? "fixed" : "planned", c.uses ? c.uses->str() : "by layout");
  fmt::print("{:<16} {:<16} {:>4} {:>9} {:>9} {:>9} {:>24} {:>9} {:>10} {:>6} {:>9} {:>7} {:>9} {:>9}\n", "hardware",
             "mask", "P", "old flat", "old kern", "new kern", "new/old mean [min, max]", "tiles old", "tiles mask",
             "slower", "tiles>5%", "blocks", "old ms", "new ms");
  for (const std::string& hw_name : c.hardware) {
    const HardwareProfile hw = resolve_hardware_profile(hw_name);
    if (!hw.kernel) throw Error("bench_step_time: --kernel-compare needs a profile with a kernel model, '" + hw_name +
                                "' has none");
    HardwareProfile flat = hw, area = hw;
    flat.kernel.reset();
    area.kernel->count_tiles = false;
    const TimeCostModel old_cost(flat), new_cost(hw);
    const std::string name = spec_plugin(c.solver);
    const PluginInfo& info = reg.find(PluginKind::solver, name);
    auto old_solver = reg.make_solver(name, reg.resolve_params(info, spec_params(c.solver, info.params)));
    auto new_solver = reg.make_solver(name, reg.resolve_params(info, spec_params(c.solver, info.params)));
    PlanShape shape = c.shape;
    shape.node_size = hw.gpus_per_node;
    {  // one untimed solve each (first-call costs)
      const auto warm = bench::standard_problem(c.masks.front(), hist, 0, std::stoi(c.cps.front()), c.layout);
      SolvePath(*old_solver, old_cost, reg).run(warm, {.shape = shape, .uses = c.uses});
      SolvePath(*new_solver, new_cost, reg).run(warm, {.shape = shape, .uses = c.uses});
    }
    for (const std::string& m : c.masks) {
      const bool packed = m == "full_document" || m == "causal_document";
      for (const std::string& cp : c.cps) {
        const int P = std::stoi(cp);
        const int n = packed ? c.packs : 1;
        double old_flat = 0, old_kern = 0, new_kern = 0, ratio = 0, tiles = 0, lo = 1e300, hi = 0, mask_tiles = 0;
        int slower = 0, tiled = 0, tiled_short = 0;
        double old_blocks = 0, new_blocks = 0;  // blocks per rank of the plans' grids
        std::vector<double> old_ms, new_ms;
        for (int pack = 0; pack < n; ++pack) {
          const auto problem = bench::standard_problem(m, hist, pack, P, c.layout);
          // Alternately first, so that neither solve always meets a warmer cache.
          SolveResult ro, rn;
          for (int k = 0; k < 2 * c.repeat; ++k) {
            const bool old_now = (k % 2 == 0) == (pack % 2 == 0);
            const auto t0 = std::chrono::steady_clock::now();
            if (old_now)
              ro = SolvePath(*old_solver, old_cost, reg).run(problem, {.shape = shape, .uses = c.uses, .rank = c.rank});
            else
              rn = SolvePath(*new_solver, new_cost, reg).run(problem, {.shape = shape, .uses = c.uses, .rank = c.rank});
            (old_now ? old_ms : new_ms).push_back(ms_since(t0));
          }
          const Problem& po = ro.assignment->grid->problem();
          const Problem& pn = rn.assignment->grid->problem();
          old_blocks += po.grid.blocks_per_rank;
          new_blocks += pn.grid.blocks_per_rank;
          // A rank plan holds one rank's metas: each whole plan again, from its assignment and shape, on the
          // profile it was planned on (its stage cut, as every rank's plan takes it).
          const auto whole = [&](const SolveResult& r, const HardwareProfile& on) {
            return build_plan(*r.assignment, {.stages = r.shape.stages,
                                              .relay_node_size = r.shape.relay_node_size(),
                                              .hardware = &on,
                                              .stage_cut = r.shape.cut,
                                              .timer = &timing_model_timer()});
          };
          std::optional<Plan> wo, wn;
          if (c.rank >= 0) wo = whole(ro, flat), wn = whole(rn, hw);
          const Plan& plo = wo ? *wo : *ro.plan;
          const Plan& pln = wn ? *wn : *rn.plan;
          const StepEstimate of = estimate_step(po, plo, flat), ok = estimate_step(po, plo, hw),
                             oa = estimate_step(po, plo, area), nk = estimate_step(pn, pln, hw);
          old_flat += of.ratio();
          old_kern += ok.ratio();
          new_kern += nk.ratio();
          const double r = nk.step() / ok.step(), t = ok.step() / oa.step();
          const double mt = mask_tile_cost(*problem, hw, area);
          mask_tiles += mt;
          ratio += r;
          tiles += t;
          lo = std::min(lo, r);
          hi = std::max(hi, r);
          slower += r > 1 + 1e-9;
          if (c.notes)
            fmt::print("  pack {} new/old {:.3f}, tiles cost old {:.3f}, the mask {:.3f}\n    old: {}\n    new: {}\n", pack,
                       r, t, mt, ro.note, rn.note);
          if (t > 1.05) {
            ++tiled;
            tiled_short += r > 0.98;
          }
        }
        fmt::print("{:<16} {:<16} {:>4} {:>9.3f} {:>9.3f} {:>9.3f} {:>8.3f} [{:.3f}, {:.3f}] {:>9.3f} {:>10.3f} {:>3}/{:<2} "
                   "{:>3}/{:<2}{:>3} {:>3.1f}/{:<3.1f} {:>9.2f} {:>9.2f}\n",
                   hw_name, m, P, old_flat / n, old_kern / n, new_kern / n, ratio / n, lo, hi, tiles / n, mask_tiles / n,
                   slower, n, tiled_short, tiled, "", old_blocks / n, new_blocks / n, median(old_ms), median(new_ms));
        std::fflush(stdout);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  bench::check_args(argc, argv, "bench_step_time",
                    {"--hardware", "--cp", "--masks", "--packs", "--solvers", "--stages", "--relay", "--layout", "--uses",
                     "--rank", "--repeat"},
                    {"--kernel-compare", "--notes", "--per-pack"});
  try {
    const auto hardware = bench::split(bench::arg(argc, argv, "--hardware", "h100_8x_nvlink,cluster_8gpu_ib"));
    const auto cps = bench::split(bench::arg(argc, argv, "--cp", "8,16,32,64,128"));
    const auto masks = bench::split(bench::arg(argc, argv, "--masks", "full,causal,full_document,causal_document"));
    const int packs = std::stoi(bench::arg(argc, argv, "--packs", "20"));
    for (const std::string& m : masks) bench::standard_mask_kind(m);  // refused before any output
    const auto solver_args =
        bench::split(bench::arg(argc, argv, "--solvers", "balanced_bytes,binary_greedy,usp,static,owner"));
    const std::string stages_arg = bench::arg(argc, argv, "--stages", "1");
    const int stages = stages_arg == "auto" ? 0 : std::stoi(stages_arg);
    const std::string relay_arg = bench::arg(argc, argv, "--relay", "off");
    if (relay_arg != "off" && relay_arg != "on" && relay_arg != "auto")
      throw Error("bench_step_time: --relay must be off, on or auto, got '" + relay_arg + "'");
    const std::string layout_arg = bench::arg(argc, argv, "--layout", "planned");
    if (layout_arg != "planned" && layout_arg != "fixed")
      throw Error("bench_step_time: --layout must be planned or fixed, got '" + layout_arg + "'");
    const Layout layout = layout_arg == "fixed" ? Layout::fixed : Layout::planned;
    const std::string uses_arg = bench::arg(argc, argv, "--uses", "");
    std::optional<PlanUses> uses;
    if (uses_arg == "ahead") uses = PlanUses::ahead();
    else if (!uses_arg.empty()) uses = PlanUses{std::stoi(uses_arg)};
    if (uses) uses->validate("bench_step_time: --uses");
    const bool per_use = uses && !uses->is_ahead();
    const Rank rank = std::stoi(bench::arg(argc, argv, "--rank", "-1"));
    const bool per_pack = bench::flag(argc, argv, "--per-pack");

    Registry reg;
    reg.scan_default_folders();
    if (bench::flag(argc, argv, "--kernel-compare")) {
      const DocHistogram h = DocHistogram::load_csv(bench::data_file(argc, argv, "doc_length_distribution.csv"));
      CompareArgs c;
      c.hardware = hardware;
      c.cps = cps;
      c.masks = masks;
      c.packs = packs;
      c.solver = plugin_spec(parse_solver(solver_args.front(), true));
      c.shape.stages = stages;
      c.shape.relay = relay_arg == "auto" ? PlanShape::Relay::automatic
                      : relay_arg == "on" ? PlanShape::Relay::on
                                          : PlanShape::Relay::off;
      c.layout = layout;
      c.uses = uses;
      c.notes = bench::flag(argc, argv, "--notes");
      c.rank = rank;
      c.repeat = std::stoi(bench::arg(argc, argv, "--repeat", "1"));
      if (c.repeat < 1) throw Error("bench_step_time: --repeat must be >= 1, got " + std::to_string(c.repeat));
      kernel_compare(reg, h, c);
      return 0;
    }
    std::vector<SolverSpec> specs;
    for (const auto& s : solver_args) specs.push_back(parse_solver(s, specs.empty()));

    const DocHistogram hist = DocHistogram::load_csv(bench::data_file(argc, argv, "doc_length_distribution.csv"));
    fmt::print("step / compute bound (mean over packs), 8192 tokens/rank, GQA 64:8, D 128, bf16, stages {}, relays {}, "
               "layout {}, uses {}{}\n",
               stages_arg, relay_arg, layout_arg, uses ? uses->str() : "by layout",
               rank >= 0 ? fmt::format(", rank {}'s plan only", rank) : std::string());
    if (per_use) fmt::print("[per use]: (path / uses + step) / bound\n");
    fmt::print("{:<16} {:<16} {:>4}", "hardware", "mask", "P");
    for (const auto& s : specs) fmt::print(" {:>22}{}", s.label.substr(0, 22), per_use ? "  per use" : "");
    fmt::print("  {:>9} {:>12}\n", "bound ms", "behind>1%");

    for (const std::string& hw_name : hardware) {
      const HardwareProfile hw = resolve_hardware_profile(hw_name);
      const PluginInfo& time_info = reg.find(PluginKind::cost_model, "time");
      auto cost = reg.make_cost_model("time", reg.resolve_params(time_info, Params({{"hardware", hw_name}})));
      const AreaCostModel area;
      std::vector<std::unique_ptr<Solver>> solvers;
      for (const auto& s : specs) {
        const std::string spec = plugin_spec(s), name = spec_plugin(spec);
        const PluginInfo& info = reg.find(PluginKind::solver, name);
        solvers.push_back(reg.make_solver(name, reg.resolve_params(info, spec_params(spec, info.params))));
      }
      PlanShape shape;
      shape.stages = stages;
      shape.relay = relay_arg == "auto" ? PlanShape::Relay::automatic
                    : relay_arg == "on" ? PlanShape::Relay::on
                                        : PlanShape::Relay::off;
      shape.node_size = hw.gpus_per_node;
      // One untimed solve per solver first: the first call in a process pays
      // one-time costs (first-touched pages, lazily built tables) that no
      // later plan does, and the latency is the median of single solves.
      {
        const auto warm = bench::standard_problem(masks.front(), hist, 0, std::stoi(cps.front()), layout);
        for (std::size_t i = 0; i < specs.size(); ++i) {
          const CostModel& c = specs[i].time_cost ? *cost : static_cast<const CostModel&>(area);
          try {
            SolvePath(*solvers[i], c, reg).run(warm, {.shape = shape, .uses = uses, .rank = rank});
          } catch (const PluginError&) {
            if (layout != Layout::fixed) throw;  // refused below, pack by pack
          }
        }
      }
      for (const std::string& m : masks) {
        const bool packed = m == "full_document" || m == "causal_document";
        for (const std::string& cp : cps) {
          const int P = std::stoi(cp);
          const int n = packed ? packs : 1;
          std::vector<double> ratio_sum(specs.size(), 0.0), per_use_sum(specs.size(), 0.0);
          std::vector<bool> refused(specs.size(), false);
          std::vector<std::vector<double>> latency(specs.size());
          double bound_sum = 0;
          int behind = 0;
          std::string worst;
          for (int pack = 0; pack < n; ++pack) {
            const auto problem = bench::standard_problem(m, hist, pack, P, layout);
            std::vector<double> steps(specs.size(), 1e300);
            for (std::size_t i = 0; i < specs.size(); ++i) {
              if (refused[i]) continue;
              const auto t0 = std::chrono::steady_clock::now();
              const CostModel& c = specs[i].time_cost ? *cost : static_cast<const CostModel&>(area);
              SolveResult r;
              try {
                r = SolvePath(*solvers[i], c, reg)
                        .run(problem, {.shape = shape, .uses = uses, .rank = rank, .solver_name = specs[i].label});
              } catch (const PluginError& e) {
                if (layout != Layout::fixed) throw;
                refused[i] = true;  // a solver that must re-lay out the tokens (static)
                continue;
              }
              const double path_ms = ms_since(t0);
              latency[i].push_back(path_ms);
              // A rank plan holds one rank's metas: price the whole plan's step from the same assignment.
              std::optional<Plan> whole;
              if (rank >= 0)
                whole = build_plan(*r.assignment, {.stages = r.shape.stages,
                                                   .relay_node_size = r.shape.relay_node_size(),
                                                   .hardware = c.hardware(),
                                                   .stage_cut = r.shape.cut,
                                                   .timer = &timing_model_timer()});
              const Plan& priced = whole ? *whole : *r.plan;
              const StepEstimate e = estimate_step(r.assignment->grid->problem(), priced, hw);
              steps[i] = e.step();
              ratio_sum[i] += e.ratio();
              if (per_use) per_use_sum[i] += (e.step() + 1e-3 * path_ms / uses->uses) / e.compute_bound;
              if (i == 0) bound_sum += e.compute_bound;
            }
            if (per_pack) {
              fmt::print("  pack {:>3} step {:.4f} ms", pack, 1e3 * steps[0]);
              for (std::size_t i = 1; i < specs.size(); ++i) fmt::print(" {:.4f}", steps[i] / steps[0]);
              fmt::print("\n");
            }
            double best_other = 1e300;
            std::size_t arg = 0;
            for (std::size_t i = 1; i < specs.size(); ++i)
              if (steps[i] < best_other) best_other = steps[i], arg = i;
            if (specs.size() > 1 && steps[0] > 1.01 * best_other) {
              ++behind;
              worst += fmt::format(" p{}:{}{:+.1f}%", pack, specs[arg].label, 100.0 * (steps[0] / best_other - 1));
            }
          }
          fmt::print("{:<16} {:<16} {:>4}", hw_name, m, P);
          for (std::size_t i = 0; i < specs.size(); ++i) {
            auto& v = latency[i];
            if (refused[i]) {
              fmt::print(" {:>22}{}", "-", per_use ? fmt::format(" {:>8}", "-") : std::string());
              continue;
            }
            std::sort(v.begin(), v.end());
            fmt::print(" {:>9.3f} ({:>8.2f}ms)", ratio_sum[i] / n, v[v.size() / 2]);
            if (per_use) fmt::print(" {:>8.3f}", per_use_sum[i] / n);
          }
          fmt::print("  {:>9.2f} {:>5}/{:<3}{}\n", 1e3 * bound_sum / n, behind, n, worst);
          std::fflush(stdout);
        }
      }
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_step_time: {}\n", e.what());
    return 1;
  }
}
