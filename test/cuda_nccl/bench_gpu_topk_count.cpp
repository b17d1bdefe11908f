// Device-side top-k counting (host/programs/topk_count.hpp) on one GPU: DSA-like
// token top-k indices already in device memory, S = 131072, k = 2048,
// H_kv = 1 (268M int32, 1 GiB), equal blocks of P = 8, 32 and 64 ranks.
// Prints the median of 5 calls of cuda::count_topk (synchronous: counting,
// scan, emit and the copy of the cells back) and, once, whether the cells
// equal core's count_index_cells. Exits 77 without a CUDA device.
//
//   bench_gpu_topk_count [--seqlen N] [--topk K] [--repeats R]
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <random>
#include <string>
#include <vector>

#include "../../tools/bench/bench_common.hpp"
#include "device/cuda_backend.hpp"
#include "device/kernels.hpp"

using namespace cpsched;
namespace g = cpsched::gpu;

int main(int argc, char** argv) {
  if (g::cuda_device_count() == 0) {
    fmt::print("no CUDA device: skipped\n");
    return 77;
  }
  const Token S = std::stoll(bench::arg(argc, argv, "--seqlen", "131072"));
  const Token k = std::stoll(bench::arg(argc, argv, "--topk", "2048"));
  const int repeats = std::stoi(bench::arg(argc, argv, "--repeats", "5"));
  // Sinks (64), the local window (512) and evenly strided earlier keys with a
  // random offset per row, sorted, -1 padded where the row is short.
  std::vector<std::int32_t> ix(static_cast<std::size_t>(S * k), -1);
  std::mt19937_64 rng(1);
  for (Token i = 0; i < S; ++i) {
    std::int32_t* row = ix.data() + i * k;
    if (i + 1 <= k) {
      for (Token j = 0; j <= i; ++j) row[j] = static_cast<std::int32_t>(j);
      continue;
    }
    const Token sink = 64, local = 512, mid = k - sink - local, lo = sink, hi = i + 1 - local;
    Token n = 0;
    for (Token j = 0; j < sink; ++j) row[n++] = static_cast<std::int32_t>(j);
    const double step = static_cast<double>(hi - lo) / static_cast<double>(mid);
    const double off = static_cast<double>(rng() % 1000) / 1000.0 * step;
    for (Token j = 0; j < mid; ++j) row[n++] = static_cast<std::int32_t>(lo + static_cast<Token>(off + step * j));
    for (Token j = hi; j <= i; ++j) row[n++] = static_cast<std::int32_t>(j);
  }
  void* d_ix = nullptr;
  g::cuda::check(cudaMalloc(&d_ix, ix.size() * sizeof(std::int32_t)), "cudaMalloc(indices)");
  g::cuda::check(cudaMemcpy(d_ix, ix.data(), ix.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice), "upload");
  IndexMask m;
  m.kind = IndexMaskKind::topk;
  m.seqlen = S;
  m.indices = IndexArray::view(ix, {S, 1, k}, "<bench>");
  fmt::print("device top-k counting, S = {}, k = {}, H_kv = 1 ({:.2f} GiB of indices), median of {}\n", S, k,
             static_cast<double>(ix.size()) * 4 / (1 << 30), repeats);
  for (int P : {8, 32, 64}) {
    std::vector<Range> blocks;
    for (int b = 0; b < P; ++b) blocks.push_back({S * b / P, S * (b + 1) / P});
    const g::TopkDims d{S, 1, static_cast<int>(k), true, true};
    std::vector<IndexCell> cells;
    const double ms = bench::median_ms(repeats, [&] {
      cells = g::cuda::count_topk(static_cast<const std::int32_t*>(d_ix), d, blocks, "<bench>", nullptr);
    });
    const std::vector<IndexCell> want = count_index_cells(m, blocks);
    bool same = want.size() == cells.size();
    for (std::size_t i = 0; same && i < cells.size(); ++i)
      same = cells[i].area == want[i].area && cells[i].rows == want[i].rows && cells[i].cols == want[i].cols &&
             cells[i].qblock == want[i].qblock && cells[i].kblock == want[i].kblock;
    fmt::print("P = {:>3}: {:>9.2f} ms median, {} cells, {}\n", P, ms, cells.size(),
               same ? "equal to count_index_cells" : "DIFFERENT from count_index_cells");
  }
  cudaFree(d_ix);
  return 0;
}
