// How far the links alone keep any plan of the fixed layout from the compute
// bound: a lower bound on the step of every placement of the seed-42 packs
// (8192 tokens per rank, GQA 64:8, D 128, bf16, flattened head groups) on the
// problem's own sharding, from a linear program solved with GLPK. Prints, per
// hardware profile x mask x P, the mean and the largest bound / compute bound
// over the packs, beside the step / bound of the default solver's plan made
// ahead on the same layout (stages and relays its choice), and the packs where
// the bound would exceed that plan's step (a bug: it must be 0). 1.000 means
// the bytes of some placement fit beside its compute on every port: what keeps
// a plan above the bound is then how its transfers are ordered (stages,
// reduces), not how much must move.
//
//   bench_volume_bound [--hardware h100_8x_nvlink,cluster_8gpu_ib] [--cp 8,16,32,64,128]
//                      [--masks causal_document,full_document] [--packs 20] [--data-dir DIR]
//
// The program (per pass, forward and backward, each with its own time T_f,
// T_b; minimise T_f + T_b). A unit is a node (P above the profile's GPUs per
// node) or a rank (one node). x[c][r]: the share of cell c computed on rank r
// (every cell wholly placed). y[s][n]: the share of segment s (the byte
// model's token segments, search/byte_model.hpp) present on unit n, which it
// must be wherever a rank of n computes a share of a cell needing it:
//   sum over r in n of x[c][r] <= y[s][n]    (s not hosted on n)
// and per pass:
//   each rank's compute                                    <= T
//   each rank's out bytes (its segments to other units,
//     and back what it computed for them) x time per byte   <= T
//   the same for its in bytes
//   each unit's received and returned bytes, over its ranks <= T x ranks per unit
// Every plan of the format satisfies these with its shares 0 or 1: a rank's
// rows leave through its own port, a segment crosses into a node at least once
// (relays forward it inside), and the head groups are alike, so the program
// is solved for one group and scaled. Latencies, the HBM kernels and the
// order of transfers are left out, so the bound is below every plan's step.
#include <glpk.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_common.hpp"
#include "standard_workload.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/plugin/cost_model.hpp"
#include "cpsched/plugin/registry.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/problem/task_grid.hpp"
#include "cpsched/search/byte_model.hpp"
#include "cpsched/session/solve_path.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/timing/model.hpp"

using namespace cpsched;

namespace {

// One GLPK problem, freed on every way out.
struct Lp {
  glp_prob* p = glp_create_prob();
  std::vector<int> ia{0}, ja{0};
  std::vector<double> ar{0.0};
  Lp() { glp_set_obj_dir(p, GLP_MIN); }
  ~Lp() { glp_delete_prob(p); }
  Lp(const Lp&) = delete;
  Lp& operator=(const Lp&) = delete;
  int row_at_most_zero() {
    const int r = glp_add_rows(p, 1);
    glp_set_row_bnds(p, r, GLP_UP, 0.0, 0.0);
    return r;
  }
  void add(int row, int col, double v) {
    ia.push_back(row);
    ja.push_back(col);
    ar.push_back(v);
  }
};

struct Bound {
  double step_s = 0;           // the program's T_f + T_b
  double compute_bound_s = 0;  // all compute / P
};

Bound volume_bound(const TaskGrid& grid, const HardwareProfile& hw) {
  if (grid.per_group_cells()) throw Error("head groups with their own cells are not supported");
  const Problem& p = grid.problem();
  const TimePrices tp = time_prices(hw);
  const search::ByteModel bm(grid, 1.0, 0.0);
  const int P = grid.cp_size();
  const int G = grid.num_groups();
  const bool nodes = P > hw.gpus_per_node;
  const int u = nodes ? hw.gpus_per_node : 1;  // ranks per unit
  const int N = (P + u - 1) / u;
  const double byte_ms = tp.byte_s[nodes ? 1 : 0] * 1e3;
  const double pair_flops = p.heads.fwd_flops_per_pair();
  const double load_ms[2] = {pair_flops * tp.flop_s[0] * 1e3, pair_flops * p.heads.bwd_flops_ratio() * tp.flop_s[1] * 1e3};
  const TransferBytes per_token[2] = {fwd_bytes_per_token(p), bwd_bytes_per_token(p)};
  const int C = bm.num_cells(), S = bm.num_segments();
  auto unit = [&](Rank r) { return static_cast<int>(r) / u; };

  std::vector<double> cell_load(static_cast<std::size_t>(C), 0.0);
  for (int c = 0; c < C; ++c) cell_load[static_cast<std::size_t>(c)] = static_cast<double>(grid.load(c * G));

  Lp lp;
  const int nx = C * P, ny = S * N;
  glp_add_cols(lp.p, nx + ny + 2);
  auto X = [&](int c, int r) { return 1 + c * P + r; };
  auto Y = [&](int s, int n) { return 1 + nx + s * N + n; };
  const int T[2] = {1 + nx + ny, 2 + nx + ny};
  for (int j = 1; j <= nx + ny; ++j) glp_set_col_bnds(lp.p, j, GLP_DB, 0.0, 1.0);
  for (int s = 0; s < S; ++s) glp_set_col_bnds(lp.p, Y(s, unit(bm.segment(s).host)), GLP_FX, 0.0, 0.0);
  for (int t : T) {
    glp_set_col_bnds(lp.p, t, GLP_LO, 0.0, 0.0);
    glp_set_obj_coef(lp.p, t, 1.0);
  }

  for (int c = 0; c < C; ++c) {
    const int placed = glp_add_rows(lp.p, 1);
    glp_set_row_bnds(lp.p, placed, GLP_FX, 1.0, 1.0);
    for (int r = 0; r < P; ++r) lp.add(placed, X(c, r), 1.0);
    for (int n = 0; n < N; ++n)
      for (const auto segs : {bm.qo_segments(c), bm.kv_segments(c)})
        for (const int s : segs) {
          if (unit(bm.segment(s).host) == n) continue;
          const int needs = lp.row_at_most_zero();
          for (int r = n * u; r < std::min(P, (n + 1) * u); ++r) lp.add(needs, X(c, r), 1.0);
          lp.add(needs, Y(s, n), -1.0);
        }
  }
  for (int pass = 0; pass < 2; ++pass) {
    const TransferBytes& b = per_token[pass];
    auto bytes_ms = [&](int s, bool out) {
      const search::Segment& sg = bm.segment(s);
      const bool qo = sg.dir == RowKind::qo;
      const double per = static_cast<double>(out ? (qo ? b.qo_out : b.kv_out) : (qo ? b.qo_back : b.kv_back));
      return static_cast<double>(sg.tokens.size()) * per * byte_ms * G;
    };
    for (int r = 0; r < P; ++r) {
      const int compute = lp.row_at_most_zero();
      for (int c = 0; c < C; ++c)
        if (cell_load[static_cast<std::size_t>(c)] > 0)
          lp.add(compute, X(c, r), cell_load[static_cast<std::size_t>(c)] * load_ms[pass] * G);
      lp.add(compute, T[pass], -1.0);
    }
    // A host rank's own port: its segments out to other units, their results back.
    std::vector<int> host_out(static_cast<std::size_t>(P)), host_in(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) {
      host_out[static_cast<std::size_t>(r)] = lp.row_at_most_zero();
      host_in[static_cast<std::size_t>(r)] = lp.row_at_most_zero();
      lp.add(host_out[static_cast<std::size_t>(r)], T[pass], -1.0);
      lp.add(host_in[static_cast<std::size_t>(r)], T[pass], -1.0);
    }
    // A unit's ports together: what it receives and what it returns.
    std::vector<int> unit_in(static_cast<std::size_t>(N)), unit_out(static_cast<std::size_t>(N));
    for (int n = 0; n < N; ++n) {
      unit_in[static_cast<std::size_t>(n)] = lp.row_at_most_zero();
      unit_out[static_cast<std::size_t>(n)] = lp.row_at_most_zero();
      lp.add(unit_in[static_cast<std::size_t>(n)], T[pass], -u);
      lp.add(unit_out[static_cast<std::size_t>(n)], T[pass], -u);
    }
    for (int s = 0; s < S; ++s) {
      const auto h = static_cast<std::size_t>(bm.segment(s).host);
      const double out = bytes_ms(s, true), back = bytes_ms(s, false);
      for (int n = 0; n < N; ++n) {
        if (n == unit(bm.segment(s).host)) continue;
        lp.add(host_out[h], Y(s, n), out);
        lp.add(host_in[h], Y(s, n), back);
        lp.add(unit_in[static_cast<std::size_t>(n)], Y(s, n), out);
        lp.add(unit_out[static_cast<std::size_t>(n)], Y(s, n), back);
      }
    }
  }
  glp_load_matrix(lp.p, static_cast<int>(lp.ia.size()) - 1, lp.ia.data(), lp.ja.data(), lp.ar.data());
  glp_smcp parm;
  glp_init_smcp(&parm);
  parm.msg_lev = GLP_MSG_OFF;
  parm.presolve = GLP_ON;
  const int rc = glp_simplex(lp.p, &parm);
  if (rc != 0 || glp_get_status(lp.p) != GLP_OPT)
    throw Error(fmt::format("GLPK did not solve the program (glp_simplex {}, status {})", rc,
                            glp_get_status(lp.p)));
  double total = 0;
  for (int c = 0; c < C; ++c) total += cell_load[static_cast<std::size_t>(c)] * G;
  return {glp_get_obj_val(lp.p) * 1e-3, total * (load_ms[0] + load_ms[1]) * 1e-3 / P};
}

}  // namespace

int main(int argc, char** argv) try {
  bench::check_args(argc, argv, "bench_volume_bound", {"--hardware", "--cp", "--masks", "--packs"});
  const auto profiles = bench::split(bench::arg(argc, argv, "--hardware", "h100_8x_nvlink,cluster_8gpu_ib"));
  const auto cps = bench::split(bench::arg(argc, argv, "--cp", "8,16,32,64,128"));
  const auto masks = bench::split(bench::arg(argc, argv, "--masks", "causal_document,full_document"));
  const int packs = std::stoi(bench::arg(argc, argv, "--packs", "20"));
  for (const std::string& m : masks) bench::standard_mask_kind(m);  // refused before any output
  if (packs < 1) throw Error("--packs must be at least 1");
  const DocHistogram hist = DocHistogram::load_csv(bench::data_file(argc, argv, "doc_length_distribution.csv"));
  glp_term_out(GLP_OFF);
  Registry reg;
  reg.scan_default_folders();
  const auto solver = reg.make_solver("balanced_bytes", reg.resolve_params(reg.find(PluginKind::solver, "balanced_bytes"), Params{}));

  fmt::print("bound / compute bound, layout fixed (sequential shards), over {} pack(s); default: balanced_bytes made "
             "ahead, stages and relays auto\n", packs);
  fmt::print("{:<18} {:<17} {:>5} {:>11} {:>10} {:>9} {:>13}\n", "hardware", "mask", "P", "bound mean", "bound max",
             "default", "bound>step");
  for (const std::string& name : profiles) {
    const HardwareProfile hw = resolve_hardware_profile(name);
    const auto cost = reg.make_cost_model(
        "time", reg.resolve_params(reg.find(PluginKind::cost_model, "time"), Params({{"hardware", name}})));
    PlanShape shape;
    shape.stages = 0;
    shape.relay = PlanShape::Relay::automatic;
    shape.node_size = hw.gpus_per_node;
    for (const std::string& m : masks)
      for (const std::string& cp : cps) {
        const int P = std::stoi(cp);
        double sum = 0, worst = 0, plan_sum = 0;
        int above = 0;
        for (int pack = 0; pack < packs; ++pack) {
          const auto problem = bench::standard_problem(m, hist, pack, P, Layout::fixed);
          const TaskGrid grid(problem);
          const Bound b = volume_bound(grid, hw);
          const double ratio = b.step_s / b.compute_bound_s;
          sum += ratio;
          worst = std::max(worst, ratio);
          const SolveResult r = SolvePath(*solver, *cost, reg)
                                    .run(problem, {.shape = shape, .uses = PlanUses::ahead(), .rank = -1,
                                                   .solver_name = "balanced_bytes"});
          const StepEstimate e = estimate_step(*problem, *r.plan, hw);
          plan_sum += e.ratio();
          if (b.step_s > e.step() * (1 + 1e-9)) ++above;
        }
        fmt::print("{:<18} {:<17} {:>5} {:>11.3f} {:>10.3f} {:>9.3f} {:>13}\n", hw.name, m, P, sum / packs, worst,
                   plan_sum / packs, above);
        std::fflush(stdout);
      }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_volume_bound: %s\n", e.what());
  return 1;
}
