// The kernel model of a hardware profile (hardware/kernel_model.hpp): tiles
// touched against a brute-force count, the rate table (its points, the
// interpolation between them, aliases, rates relative to another GPU's),
// the profile's errors, what the bundled profiles hold, and a task's kernel
// seconds as the solvers and the cost model read them.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <set>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/plugin/cost_model.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/hardware/kernel_model.hpp"
#include "cpsched/timing/model.hpp"
#include "cpsched/hardware/task_kernel.hpp"
#include "plan_fixtures.hpp"
#include "random_specs.hpp"

using namespace cpsched;

namespace {

// Tiles holding an unmasked entry of the arg, entry by entry.
std::int64_t brute_tiles(MaskType type, Token lq, Token lk, int tq, int tk) {
  std::set<std::pair<Token, Token>> tiles;
  const Slice s{{0, lq}, {0, lk}, type};
  for (Token i = 0; i < lq; ++i)
    for (Token j = 0; j < lk; ++j)
      if (slice_area(s, {i, i + 1}, {j, j + 1}) == 1) tiles.insert({i / tq, j / tk});
  return static_cast<std::int64_t>(tiles.size());
}

// A profile text with a kernel block (the h100 profile's other keys).
std::string profile_with(const std::string& kernel) {
  return "name: t\nattention_tflops: {fwd: 500, bwd: 400}\n" + kernel +
         "hbm_gb_s: 2800\ngpus_per_node: 8\nintra_node: {bandwidth_gb_s: 360, latency_us: 4}\n"
         "inter_node: {bandwidth_gb_s: 45, latency_us: 12}\noverlap: true\n";
}

const char* kGoodKernel =
    "kernel:\n"
    "  fwd:\n"
    "    tile: {q: 128, k: 64}\n"
    "    call_us: 5\n"
    "    entry_us: 0.5\n"
    "    lengths: [1024, 4096]\n"
    "    tflops:\n"
    "      full: [400, 480]\n"
    "      causal: [300, 450]\n"
    "      bi_causal: causal\n"
    "  bwd:\n"
    "    tile: {q: 64, k: 128}\n"
    "    call_us: 0\n"
    "    entry_us: 0\n"
    "    lengths: [2048]\n"
    "    tflops: {full: [350], index: [200]}\n";

}  // namespace

TEST_CASE("kernel model: tiles touched equal a brute-force count on random args of all four forms") {
  std::mt19937_64 rng(48);
  int checked = 0;
  for (int i = 0; i < 3000; ++i) {
    const auto type = static_cast<MaskType>(rng() % 4);
    const Token lq = 1 + static_cast<Token>(rng() % 70), lk = 1 + static_cast<Token>(rng() % 70);
    const int tq = 1 + static_cast<int>(rng() % 17), tk = 1 + static_cast<int>(rng() % 17);
    CAPTURE(static_cast<int>(type));
    CAPTURE(lq);
    CAPTURE(lk);
    CAPTURE(tq);
    CAPTURE(tk);
    CHECK(tiles_touched(type, lq, lk, tq, tk) == brute_tiles(type, lq, lk, tq, tk));
    ++checked;
  }
  // The profiles' tiles on lengths of the plans (a few, the count is O(lq lk)).
  for (MaskType type : {MaskType::full, MaskType::causal, MaskType::inv_causal, MaskType::bi_causal})
    for (auto [lq, lk] : {std::pair<Token, Token>{300, 300}, {1000, 1300}, {1300, 1000}, {128, 4096}, {513, 513}})
      for (auto [tq, tk] : {std::pair<int, int>{128, 128}, {64, 128}}) {
        CAPTURE(static_cast<int>(type));
        CAPTURE(lq);
        CAPTURE(lk);
        CHECK(tiles_touched(type, lq, lk, tq, tk) == brute_tiles(type, lq, lk, tq, tk));
      }
  CHECK(tiles_touched(MaskType::causal, 0, 10, 4, 4) == 0);
  CHECK(tiles_touched(MaskType::bi_causal, 10, 5, 4, 4) == 0);  // Lq > Lk: an empty band
  CHECK(checked == 3000);
}

TEST_CASE("kernel model: an index arg's tiles are those of its rows x its padded width") {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 500; ++i) {
    const Token rows = 1 + static_cast<Token>(rng() % 50);
    const std::int64_t width = 1 + static_cast<std::int64_t>(rng() % 300);
    const int tq = 1 + static_cast<int>(rng() % 9), tk = 1 + static_cast<int>(rng() % 70);
    std::set<std::pair<Token, std::int64_t>> tiles;  // every slot [r, j] of the [rows, width] layout
    for (Token r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < width; ++j) tiles.insert({r / tq, j / tk});
    CHECK(index_tiles(rows, width, tq, tk) == static_cast<std::int64_t>(tiles.size()));
  }
}

TEST_CASE("kernel model: a table point's arg takes the published time; log-linear between points, clamped") {
  const HardwareProfile hw = parse_hardware_profile(profile_with(kGoodKernel), "t.yaml");
  REQUIRE(hw.kernel);
  const KernelModel& km = *hw.kernel;
  const double fpp = 4.0 * 128 * 8;  // 4 D x 8 heads
  auto arg = [](MaskType t, Token lq, Token lk) {
    return KernelArg{kernel_form(t), lq, lk, slice_area(Slice{{0, lq}, {0, lk}, t}), 0};
  };
  // At a point: exactly area x FLOPs / the published rate (+ the entry).
  for (auto [t, rate, L] : {std::tuple<MaskType, double, Token>{MaskType::full, 400, 1024},
                            {MaskType::causal, 300, 1024}, {MaskType::causal, 450, 4096}}) {
    const KernelArg a = arg(t, L, L);
    CHECK(km.arg_seconds(Pass::fwd, a, fpp, 500) ==
          doctest::Approx(static_cast<double>(a.area) * fpp / (rate * 1e12) + 0.5e-6).epsilon(1e-12));
  }
  // Between: the tile rate is linear in log2(length) (2048: the midpoint).
  const KernelRates& f = km.fwd;
  const auto c = static_cast<std::size_t>(KernelForm::causal);
  CHECK(f.tile_rate(KernelForm::causal, 2048) ==
        doctest::Approx(0.5 * (f.tile_tflops[c][0] + f.tile_tflops[c][1])).epsilon(1e-12));
  CHECK(f.area_rate(KernelForm::causal, 2048) == doctest::Approx(375).epsilon(1e-12));
  CHECK(f.tile_rate(KernelForm::causal, 100) == f.tile_tflops[c][0]);   // clamped below
  CHECK(f.tile_rate(KernelForm::causal, 1e6) == f.tile_tflops[c][1]);   // and above
  // A tile rate is the rate of the point's arg counted in tiles: causal
  // 1024 x 1024 in 128 x 64 tiles wastes its diagonal's halves.
  const double tiles = static_cast<double>(tiles_touched(MaskType::causal, 1024, 1024, 128, 64)) * 128 * 64;
  CHECK(f.tile_tflops[c][0] == doctest::Approx(300 * tiles / (1024.0 * 1025 / 2)).epsilon(1e-12));
  // An alias takes the other form's rates; a form out of the table is priced
  // on its area at the peak, without fixed costs.
  CHECK(f.holds(KernelForm::bi_causal));
  CHECK(f.area_tflops[static_cast<std::size_t>(KernelForm::bi_causal)] == f.area_tflops[c]);
  CHECK(!f.holds(KernelForm::inv_causal));
  const KernelArg inv = arg(MaskType::inv_causal, 300, 400);
  CHECK(km.arg_seconds(Pass::fwd, inv, fpp, 500) == static_cast<double>(inv.area) * fpp / (500 * 1e12));
  // count_tiles off: the same rates on the exact area.
  KernelModel area = km;
  area.count_tiles = false;
  const KernelArg odd = arg(MaskType::causal, 700, 900);
  CHECK(area.arg_seconds(Pass::fwd, odd, fpp, 500) ==
        doctest::Approx(static_cast<double>(odd.area) * fpp / (f.area_rate(KernelForm::causal, 900) * 1e12) + 0.5e-6)
            .epsilon(1e-12));
  CHECK(km.arg_seconds(Pass::fwd, odd, fpp, 500) > area.arg_seconds(Pass::fwd, odd, fpp, 500));
  // Backward: its inner loop is the queries (the rate's length), index args
  // tile rows x width.
  const KernelArg idx{KernelForm::index, 100, 5000, 100 * 30, 40};
  CHECK(km.arg_seconds(Pass::bwd, idx, fpp, 400) ==
        doctest::Approx(static_cast<double>(index_tiles(100, 40, 64, 128)) * 64 * 128 * fpp /
                        (km.bwd.tile_rate(KernelForm::index, 100) * 1e12))
            .epsilon(1e-12));
  // A stage's calls: one per (q buffer, k buffer, form) held.
  KernelStage st(km, Pass::fwd, fpp, 500);
  st.add(arg(MaskType::causal, 64, 64), BufferId::local, BufferId::local);
  st.add(arg(MaskType::causal, 32, 64), BufferId::local, BufferId::local);
  st.add(arg(MaskType::full, 64, 64), BufferId::local, BufferId::remote);
  st.add(inv, BufferId::local, BufferId::local);  // not held: no call
  const double args = km.arg_seconds(Pass::fwd, arg(MaskType::causal, 64, 64), fpp, 500) +
                      km.arg_seconds(Pass::fwd, arg(MaskType::causal, 32, 64), fpp, 500) +
                      km.arg_seconds(Pass::fwd, arg(MaskType::full, 64, 64), fpp, 500);
  CHECK(st.seconds() == doctest::Approx(args + static_cast<double>(inv.area) * fpp / 500e12 + 2 * 5e-6).epsilon(1e-12));
}

TEST_CASE("kernel model: rates measured on another GPU, scaled to the profile's peak") {
  const std::string k =
      "kernel:\n"
      "  fwd: {relative_to: 1000, tile: {q: 64, k: 64}, call_us: 0, entry_us: 0, lengths: [512, 1024], tflops: "
      "{full: [800, 1000]}}\n"
      "  bwd: {tile: {q: 64, k: 64}, call_us: 0, entry_us: 0, lengths: [512], tflops: {full: [300]}}\n";
  const HardwareProfile hw = parse_hardware_profile(profile_with(k), "t.yaml");
  CHECK(hw.kernel->fwd.area_rate(KernelForm::full, 512) == doctest::Approx(400));
  CHECK(hw.kernel->fwd.area_rate(KernelForm::full, 1024) == doctest::Approx(500));
  CHECK(hw.kernel->bwd.area_rate(KernelForm::full, 512) == 300);
}

TEST_CASE("kernel model: a profile's errors name the file, line, column and key") {
  auto error_of = [](const std::string& kernel) {
    try {
      parse_hardware_profile(profile_with(kernel), "configs/x.yaml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string good = kGoodKernel;
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const auto at = s.find(from);
    REQUIRE(at != std::string::npos);
    return s.replace(at, from.size(), to);
  };
  CHECK(error_of(with("tile: {q: 128, k: 64}", "tile: {q: 128}")) ==
        "configs/x.yaml:5:11: key 'kernel.fwd.tile': missing key 'k'");
  CHECK(error_of(with("tile: {q: 128, k: 64}", "tile: {q: 128.5, k: 64}")) ==
        "configs/x.yaml:5:15: key 'kernel.fwd.tile.q': must be a whole number");
  CHECK(error_of(with("tile: {q: 128, k: 64}", "tile: {q: 0, k: 64}")) ==
        "configs/x.yaml:5:15: key 'kernel.fwd.tile.q': must be >= 1 (got 0)");
  CHECK(error_of(with("      full: [400, 480]", "      full: [400]")) ==
        "configs/x.yaml:10:13: key 'kernel.fwd.tflops.full': 1 rates for 2 lengths");
  CHECK(error_of(with("      full: [400, 480]", "      full: [400, -1]")) ==
        "configs/x.yaml:10:19: key 'kernel.fwd.tflops.full[1]': must be a finite number > 0 and at most 1e+06 (got -1)");
  CHECK(error_of(with("lengths: [1024, 4096]", "lengths: [4096, 1024]")) ==
        "configs/x.yaml:8:21: key 'kernel.fwd.lengths[1]': lengths must be strictly ascending");
  CHECK(error_of(with("      bi_causal: causal", "      band: causal")) ==
        "configs/x.yaml:12:7: key 'kernel.fwd.tflops.band': unknown key (known: full, causal, inv_causal, bi_causal, "
        "index)");
  CHECK(error_of(with("      bi_causal: causal", "      bi_causal: inv_causal")) ==
        "configs/x.yaml:12:18: key 'kernel.fwd.tflops.bi_causal': must be a list of TFLOP/s, one per length, or the "
        "name of another form of this table with its own list (got 'inv_causal')");
  CHECK(error_of(with("    call_us: 5\n", "")) == "configs/x.yaml:5:5: key 'kernel.fwd': missing key 'call_us'");
  CHECK(error_of(with("  bwd:", "  back:")) ==
        "configs/x.yaml:13:3: key 'kernel.back': unknown key (known: fwd, bwd)");
  CHECK(error_of(with("    entry_us: 0.5", "    entry_us: [1]")) ==
        "configs/x.yaml:7:15: key 'kernel.fwd.entry_us': expected a number, got 'a list'");
  CHECK(error_of(with("    tflops:\n      full: [400, 480]\n      causal: [300, 450]\n      bi_causal: causal\n",
                      "    tflops: {}\n")) == "configs/x.yaml:9:13: key 'kernel.fwd.tflops': holds no mask form");
}

TEST_CASE("kernel model: the bundled profiles hold cuDNN's published H200 rates (H100s: relative to their peak)") {
  const HardwareProfile h200 = resolve_hardware_profile("h200_8x_nvlink");
  REQUIRE(h200.kernel);
  CHECK(h200.fwd_tflops == 702);
  CHECK(h200.bwd_tflops == 612);
  CHECK(h200.kernel->fwd.area_rate(KernelForm::causal, 2048) == 484);
  CHECK(h200.kernel->fwd.area_rate(KernelForm::causal, 32768) == 688);
  CHECK(h200.kernel->bwd.area_rate(KernelForm::full, 16384) == 612);
  CHECK(h200.kernel->fwd.tile_q == 128);
  CHECK(h200.kernel->bwd.tile_q == 64);
  CHECK(!h200.kernel->fwd.holds(KernelForm::index));
  for (const char* name : {"h100_8x_nvlink", "cluster_8gpu_ib"}) {
    const HardwareProfile hw = resolve_hardware_profile(name);
    REQUIRE(hw.kernel);
    CHECK(hw.fwd_tflops == 550);  // the compute bound's rate is the profile's own
    CHECK(hw.kernel->fwd.area_rate(KernelForm::causal, 2048) == doctest::Approx(484.0 * 550 / 702));
    CHECK(hw.kernel->bwd.area_rate(KernelForm::full, 16384) == doctest::Approx(420));
    CHECK(hw.kernel->fwd.area_rate(KernelForm::inv_causal, 4096) == hw.kernel->fwd.area_rate(KernelForm::causal, 4096));
  }
}

TEST_CASE("kernel model: a task's kernel seconds are its args' in the plan; the cost model and the bound read them") {
  const HardwareProfile hw = resolve_hardware_profile("h100_8x_nvlink");
  std::mt19937_64 rng(11);
  for (MaskKind kind : {MaskKind::causal_document, MaskKind::sliding_window, MaskKind::slices, MaskKind::full}) {
    auto grid = test::random_grid(kind, 8, Heads{64, 8, 128, 2}, rng);
    const Assignment a = test::owner_assignment(grid);
    const auto ks = task_kernel_seconds(*grid, hw);
    REQUIRE(ks);
    CHECK(task_kernel_seconds(*grid, hw) == ks);  // kept for the grid
    // Owner, one stage: each rank runs its tasks' args, the same ones.
    const Plan plan = build_plan(a, PlanOptions{1, 0});
    const std::vector<RankCompute> pc = predicted_compute(grid->problem(), plan, hw);
    std::vector<double> fwd(8, 0.0), bwd(8, 0.0);
    const TimeCostModel cost(hw);
    for (TaskId t = 0; t < grid->num_tasks(); ++t) {
      fwd[static_cast<std::size_t>(a.rank[static_cast<std::size_t>(t)])] += ks->fwd[ks->unit_of(t)];
      bwd[static_cast<std::size_t>(a.rank[static_cast<std::size_t>(t)])] += ks->bwd[ks->unit_of(t)];
      CHECK(cost.compute(*grid, t) == doctest::Approx(ks->both[ks->unit_of(t)]).epsilon(1e-12));
    }
    for (std::size_t r = 0; r < 8; ++r) {  // (no call costs in the bundled profile)
      CHECK(pc[r].fwd == doctest::Approx(fwd[r]).epsilon(1e-12));
      CHECK(pc[r].bwd == doctest::Approx(bwd[r]).epsilon(1e-12));
      CHECK(pc[r].fwd == compute_seconds(grid->problem(), plan.ranks[r].fwd, hw, Pass::fwd));
    }
    // The timeline's compute ops last what the prediction says.
    const PassTimeline tl = simulate_pass(grid->problem(), plan, hw, Pass::fwd);
    for (std::size_t r = 0; r < 8; ++r) {
      double busy = 0;
      for (const TimedOp& op : tl.ranks[r].compute)
        if (op.kind == OpKind::compute) busy += op.end - op.start;
      CHECK(busy == doctest::Approx(pc[r].fwd).epsilon(1e-9));
    }
    // The bound on the area at peak does not move; the floor is the kernels'.
    HardwareProfile flat = hw;
    flat.kernel.reset();
    const StepEstimate e = estimate_step(grid->problem(), plan, hw), f = estimate_step(grid->problem(), plan, flat);
    CHECK(e.compute_bound == f.compute_bound);
    double all = 0;
    for (const RankCompute& c : pc) all += c.fwd + c.bwd;
    CHECK(e.compute_floor == doctest::Approx(all / 8).epsilon(1e-12));
    CHECK(e.compute_floor > e.compute_bound);
    CHECK(e.step() >= e.compute_floor * (1 - 1e-12));
  }
}
