// The __host__ __device__ mask geometry of the CUDA runtime, compiled for the
// host, against core's closed forms; and the device-side mask ingestion
// programs (run by their CPU twin) against the TaskGrid.
#include <doctest/doctest.h>

#include <random>

#include "brute_force.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/problem/task_grid.hpp"
#include "host/programs/host_exec.hpp"
#include "host/programs/mask_geometry.hpp"
#include "host/programs/mask_ingest.hpp"
#include "plans.hpp"

using namespace cpsched;
namespace g = cpsched::gpu;

namespace {

Range to_range(g::Iv v) { return v.empty() ? Range{} : Range{v.b, v.e}; }

g::Band2 band(const Slice& s) {
  return g::band_of(s.q.begin, s.q.end, s.k.begin, s.k.end, static_cast<std::int32_t>(s.type));
}

}  // namespace

TEST_CASE("device slice geometry equals core's slice_area and needed rows/cols on random slices and rectangles") {
  std::mt19937_64 rng(2024);
  const MaskType types[] = {MaskType::full, MaskType::causal, MaskType::inv_causal, MaskType::bi_causal};
  int nonempty = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const Token qs = static_cast<Token>(rng() % 50), ks = static_cast<Token>(rng() % 50);
    const Token lq = 1 + static_cast<Token>(rng() % 40);
    const Token lk = iter % 3 == 0 ? lq : 1 + static_cast<Token>(rng() % 40);
    const Slice s{{qs, qs + lq}, {ks, ks + lk}, types[iter % 4]};
    Range qr{static_cast<Token>(rng() % 80), 0}, kr{static_cast<Token>(rng() % 80), 0};
    qr.end = qr.begin + static_cast<Token>(rng() % 60);
    kr.end = kr.begin + static_cast<Token>(rng() % 60);
    if (iter % 7 == 0) {
      qr = s.q;
      kr = s.k;
    }
    INFO("slice q=[", qs, ",", qs + lq, ") k=[", ks, ",", ks + lk, ") ", to_string(s.type), " rect q=[", qr.begin,
         ",", qr.end, ") k=[", kr.begin, ",", kr.end, ")");
    const g::Band2 c = g::clip(band(s), {qr.begin, qr.end}, {kr.begin, kr.end});
    REQUIRE(g::band_area(c) == slice_area(s, qr, kr));
    REQUIRE(to_range(g::band_rows(c)) == slice_needed_rows(s, qr, kr));
    REQUIRE(to_range(g::band_cols(c)) == slice_needed_cols(s, qr, kr));
    if (g::band_area(c) > 0) ++nonempty;
  }
  CHECK(nonempty > 5000);
}

TEST_CASE("per-row and per-col intervals of the device geometry are exactly the slice's entries") {
  std::mt19937_64 rng(99);
  const MaskType types[] = {MaskType::full, MaskType::causal, MaskType::inv_causal, MaskType::bi_causal};
  for (int iter = 0; iter < 400; ++iter) {
    const Token lq = 1 + static_cast<Token>(rng() % 24), lk = 1 + static_cast<Token>(rng() % 24);
    const Token qs = static_cast<Token>(rng() % 10), ks = static_cast<Token>(rng() % 10);
    const Slice s{{qs, qs + lq}, {ks, ks + lk}, types[iter % 4]};
    const g::Band2 b = band(s);
    for (Token q = 0; q < 40; ++q)
      for (Token k = 0; k < 40; ++k) {
        const bool in = slice_contains(s, q, k);
        REQUIRE(g::band_contains(b, q, k) == in);
        const g::Iv rc = s.q.contains(q) ? g::row_cols(b, q) : g::Iv{0, 0};
        REQUIRE((k >= rc.b && k < rc.e) == in);
        const g::Iv cr = g::col_rows(b, k);
        REQUIRE((q >= cr.b && q < cr.e) == in);
      }
  }
}

TEST_CASE("device mask ingestion (CPU twin) gives the TaskGrid's cell areas and needed rows/cols") {
  std::mt19937_64 rng(5);
  for (int iter = 0; iter < 12; ++iter) {
    const Token S = 200 + static_cast<Token>(rng() % 300);
    const int P = 1 + static_cast<int>(rng() % 5);
    const int c = 1 + static_cast<int>(rng() % 3);
    RangeMask mask = iter % 3 == 0 ? test::generated_mask(MaskKind::causal_document, S, {S / 3, S / 4, S - S / 3 - S / 4})
                                   : test::random_document_mask(S, rng);
    auto problem = std::make_shared<const Problem>(Problem::make(mask, P, Heads{4, 2, 16, 2}, GridOptions{true, c}));
    const TaskGrid grid(problem);
    const std::vector<g::DevSlice> slices = g::to_dev_slices(mask.slices());
    const std::vector<g::i64> bounds = g::block_bounds(grid.sharding());
    const int n = static_cast<int>(slices.size()), nb = grid.sharding().num_blocks();
    std::vector<g::i64> counts(static_cast<std::size_t>(n) + 1, 0);
    g::run_on_host(g::IngestCount{slices.data(), n, bounds.data(), nb, counts.data()},
                   (n + g::kDataThreads - 1) / g::kDataThreads);
    const std::vector<g::i64> raw(counts.begin(), counts.end() - 1);
    g::run_on_host(g::IngestScan{counts.data(), n}, 1);
    g::i64 expect = 0;
    for (int i = 0; i < n; ++i) {
      REQUIRE(counts[static_cast<std::size_t>(i)] == expect);
      expect += raw[static_cast<std::size_t>(i)];
    }
    REQUIRE(counts[static_cast<std::size_t>(n)] == expect);
    std::vector<g::CellRecord> records(static_cast<std::size_t>(expect));
    std::vector<g::i64> area(static_cast<std::size_t>(nb) * static_cast<std::size_t>(nb), 0);
    g::run_on_host(g::IngestEmit{slices.data(), n, bounds.data(), nb, counts.data(), records.data(), area.data()},
                   (n + g::kDataThreads - 1) / g::kDataThreads);
    const std::vector<g::IngestedCell> cells = g::cells_from_records(records);
    REQUIRE(cells.size() == grid.cells().size());
    for (std::size_t i = 0; i < cells.size(); ++i) {
      const Cell& want = grid.cells()[i];
      CHECK(cells[i].qblock == want.qblock);
      CHECK(cells[i].kblock == want.kblock);
      CHECK(cells[i].area == want.area);
      CHECK(area[static_cast<std::size_t>(want.qblock) * static_cast<std::size_t>(nb) +
                 static_cast<std::size_t>(want.kblock)] == want.area);
      CHECK(cells[i].rows == want.rows);
      CHECK(cells[i].cols == want.cols);
    }
  }
}
