// The one-pass prediction of a placement (predict.hpp) equals a State's
// max_rank_time under the per-rank model, and the row balance
// (balance_rows.hpp) lowers the load above the target, moves only tasks off
// ranks above it onto ranks it keeps within it, keeps a rank's local tasks
// and sends the tasks of one row that leave a rank to few ranks.
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <map>
#include <set>

#include "cpsched/search/balance_rows.hpp"
#include "cpsched/search/byte_model.hpp"
#include "cpsched/search/placements.hpp"
#include "cpsched/search/predict.hpp"
#include "cpsched/search/state.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/hardware/task_kernel.hpp"
#include "random_specs.hpp"

using namespace cpsched;

namespace {

search::TimeObjective objective(int gpus_per_node) {
  search::TimeObjective to;
  to.nodes.gpus_per_node = gpus_per_node;
  to.byte_s[0] = 1e-11;  // NVLink
  to.byte_s[1] = 8e-11;  // NIC
  to.load_s = 1e-9;
  return to;
}

std::vector<std::int64_t> loads(const TaskGrid& g, const std::vector<Rank>& rank) {
  std::vector<std::int64_t> l(static_cast<std::size_t>(g.cp_size()), 0);
  for (TaskId t = 0; t < g.num_tasks(); ++t) l[static_cast<std::size_t>(rank[static_cast<std::size_t>(t)])] += g.load(t);
  return l;
}

}  // namespace

TEST_CASE("predict_max_rank_time equals a State's prediction") {
  std::mt19937_64 rng(11);
  for (auto [P, node] : {std::pair{24, 8}, std::pair{16, 16}, std::pair{22, 4}})
    for (MaskKind kind : {MaskKind::causal_document, MaskKind::full_document, MaskKind::causal}) {
      const auto grid = test::random_grid(kind, P, Heads{16, 4, 64, 2}, rng, Layout::fixed);
      const search::ByteModel model(*grid, 1.0, 1.0);
      const search::TimeObjective to = objective(node);
      std::vector<Rank> random(static_cast<std::size_t>(grid->num_tasks()));
      for (Rank& r : random) r = static_cast<Rank>(rng() % static_cast<std::uint64_t>(P));
      for (const std::vector<Rank>& placement :
           {search::owner_placement(*grid), search::usp_placement(*grid, 8), random}) {
        const search::State st(model, placement, std::numeric_limits<std::int64_t>::max() / 4, 0.0, &to);
        CHECK(search::predict_max_rank_time(model, placement, to) ==
              doctest::Approx(st.max_rank_time()).epsilon(1e-12));
      }
    }
}

TEST_CASE("under a kernel model: a State and the one-pass prediction read each task's kernel seconds") {
  // (Bundled h100 profile: its kernel table; the same objective on exact areas without it.)
  const HardwareProfile hw = resolve_hardware_profile("h100_8x_nvlink");
  REQUIRE(hw.kernel);
  std::mt19937_64 rng(12);
  for (MaskKind kind : {MaskKind::causal_document, MaskKind::sliding_window, MaskKind::causal}) {
    const auto grid = test::random_grid(kind, 16, Heads{16, 4, 64, 2}, rng, Layout::fixed);
    const search::ByteModel model(*grid, 1.0, 1.0);
    search::TimeObjective area = objective(8);
    const Heads& h = grid->problem().heads;
    area.load_s = h.fwd_flops_per_pair() * (1.0 / (hw.fwd_tflops * 1e12) + h.bwd_flops_ratio() / (hw.bwd_tflops * 1e12));
    search::TimeObjective kernel = area;
    kernel.kernel = task_kernel_seconds(*grid, hw);
    REQUIRE(kernel.kernel);
    for (const std::vector<Rank>& placement : {search::owner_placement(*grid), search::usp_placement(*grid, 8)}) {
      const search::State st(model, placement, std::numeric_limits<std::int64_t>::max() / 4, 0.0, &kernel);
      // A rank's compute: the kernel seconds of its tasks.
      for (Rank r = 0; r < 16; ++r) {
        double want = 0;
        for (TaskId t = 0; t < grid->num_tasks(); ++t)
          if (placement[static_cast<std::size_t>(t)] == r) want += kernel.kernel->both[kernel.kernel->unit_of(t)];
        CHECK(st.port_seconds(r).compute == doctest::Approx(want).epsilon(1e-12));
      }
      const double k = search::predict_max_rank_time(model, placement, kernel);
      CHECK(k == doctest::Approx(st.max_rank_time()).epsilon(1e-12));
      // Both in one pass: the kernels' and the exact areas'.
      const auto [with, without] = search::predict_max_rank_times(model, placement, kernel);
      CHECK(with == k);
      CHECK(without == doctest::Approx(search::predict_max_rank_time(model, placement, area)).epsilon(1e-12));
      CHECK(with > without);
    }
  }
}

TEST_CASE("balance_rows: heavy ranks to the target, rows kept together") {
  std::mt19937_64 rng(3);
  for (MaskKind kind : {MaskKind::causal, MaskKind::causal_document, MaskKind::full_document}) {
    const auto grid = test::random_grid(kind, 32, Heads{16, 4, 64, 2}, rng, Layout::fixed);
    const int G = grid->num_groups();
    for (const std::vector<Rank>& start : {search::owner_placement(*grid), search::usp_placement(*grid, 8)}) {
      const std::int64_t target = (grid->total_load() + 31) / 32;
      std::vector<Rank> rank = start;
      search::balance_rows(*grid, rank, target);
      const std::vector<std::int64_t> before = loads(*grid, start), after = loads(*grid, rank);
      std::map<std::pair<std::int32_t, int>, std::set<Rank>> row_ranks;
      for (TaskId t = 0; t < grid->num_tasks(); ++t) {
        const auto u = static_cast<std::size_t>(t);
        if (rank[u] == start[u]) continue;
        // Only off ranks above the target, onto ranks that stay within it,
        // never a task local to its rank.
        CHECK(before[static_cast<std::size_t>(start[u])] > target);
        CHECK(after[static_cast<std::size_t>(rank[u])] <= target);
        CHECK_FALSE((grid->q_host(t) == start[u] && grid->k_host(t) == start[u]));
        row_ranks[{grid->cell_of(t).qblock, static_cast<int>(t % G)}].insert(rank[u]);
      }
      // The largest load does not grow, the load above the target falls.
      auto excess = [&](const std::vector<std::int64_t>& l) {
        std::int64_t e = 0;
        for (std::int64_t x : l) e += std::max<std::int64_t>(0, x - target);
        return e;
      };
      CHECK(*std::max_element(after.begin(), after.end()) <= *std::max_element(before.begin(), before.end()));
      if (excess(before) > 0) CHECK(excess(after) < excess(before));
      // The moved tasks of a row went to few ranks (each new one only once the last was full).
      std::size_t most = 0;
      for (const auto& [row, ranks] : row_ranks) most = std::max(most, ranks.size());
      CHECK(most <= 8);
      // Deterministic.
      std::vector<Rank> again = start;
      search::balance_rows(*grid, again, target);
      CHECK(again == rank);
    }
  }
}
