// Grid construction time (docs/architecture.md#data-flow: TaskGrid), 8192 tokens per rank, GQA 64:8
// flattened, causal_document packs of the bundled histogram. Prints medians.
#include <fmt/format.h>

#include <memory>

#include "bench_common.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/problem/task_grid.hpp"

using namespace cpsched;

int main(int argc, char** argv) {
  bench::check_args(argc, argv, "bench_grid", {});
  const auto hist = DocHistogram::load_csv(bench::data_file(argc, argv, "doc_length_distribution.csv"));
  const int packs = 5, repeats = 21;
  fmt::print("TaskGrid construction: causal_document, 8192 tokens/rank, GQA 64:8 flattened\n");
  fmt::print("median of {} repeats per pack; the median over {} packs is reported\n\n", repeats, packs);
  fmt::print("{:>5} {:>10} {:>8} {:>8} {:>10} {:>12}   {}\n", "P", "S", "slices", "cells", "tasks", "build ms",
             "target");
  for (int P : {8, 16, 32, 64, 128}) {
    std::vector<double> per_pack;
    std::size_t slices = 0, cells = 0;
    TaskId tasks = 0;
    for (int pack = 0; pack < packs; ++pack) {
      MaskSpec spec;
      spec.kind = MaskKind::causal_document;
      spec.histogram = hist;
      spec.pack = pack;
      const Token S = Token{8192} * P;
      auto problem = std::make_shared<const Problem>(Problem::make(make_mask(spec, S), P, Heads{64, 8, 128, 2}));
      per_pack.push_back(bench::median_ms(repeats, [&] {
        TaskGrid g(problem);
        cells = g.cells().size();
        tasks = g.num_tasks();
      }));
      slices = problem->mask.slices().size();
    }
    std::sort(per_pack.begin(), per_pack.end());
    const double ms = per_pack[per_pack.size() / 2];
    fmt::print("{:>5} {:>10} {:>8} {:>8} {:>10} {:>12.3f}   {}\n", P, Token{8192} * P, slices, cells, tasks, ms,
               P == 64 ? (ms < 5.0 ? "< 5 ms: met" : "< 5 ms: MISSED") : "");
  }
}
