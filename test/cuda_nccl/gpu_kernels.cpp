// GPU test (label gpu; exit 77 without a device): the runtime's own CUDA
// kernels (attention: kernels; cuDNN's path is gpu_cudnn.cpp's) against their
// CPU twins and the sim runtime, on one GPU.
//  1. The whole pipeline for P = 1..4 ranks as threads sharing device 0
//     (loopback backend: real kernels, streams and events; transfers through
//     host memory), head dims 64 and 128, 1-2 stages, flattened or not:
//     outputs equal the CPU emulation (same programs) to two bf16 roundings
//     (8e-3 of the largest value) and pass the
//     self-check against the sim runtime.
//  2. The executor itself on a one-rank plan (launch single, check on).
//  3. Device-side mask ingestion equals the TaskGrid.
//  4. Token top-k plans (index args on the tensor-core programs, random per
//     head and dsa, 4 and 32 query heads per kv head, and DSA's MLA: a
//     shared latent of 576 / 512 under 16 and 128 query heads) through the same
//     pipeline check as 1.
//  5. Device-side top-k counting equals count_index_cells and its CPU twin.
//  6. MLA's shared latent (576 / 512) on range masks: the range args as index
//     rows on the index programs, through the same pipeline check as 1.
#include <cmath>
#include <cstdio>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <random>
#include <thread>

#include "brute_force.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "device/cuda_backend.hpp"
#include "device/executor.hpp"
#include "device/kernels.hpp"
#include "host/run/check.hpp"
#include "host/run/emulate.hpp"
#include "host/run/inputs.hpp"
#include "plans.hpp"
#include "random_index_masks.hpp"

using namespace cpsched;
namespace g = cpsched::gpu;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

template <class T>
T* device_array(std::size_t n) {
  void* p = nullptr;
  g::cuda::check(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) && a[i] == b[i]) continue;
    num = std::max(num, std::abs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::abs(static_cast<double>(b[i])));
  }
  return a.size() != b.size() ? 1e9 : num / (den > 0 ? den : 1);
}

void run_pipeline(const test::PlanCase& c, const std::string& name);

g::PipelineOptions kernels_only() {
  g::PipelineOptions o;
  o.attention = g::AttentionMode::kernels;
  return o;
}

void pipeline_case(int P, int stages, int dim, bool flat, std::uint64_t placement) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(P * 100 + stages * 10 + dim));
  const Token S = 400 * P + static_cast<Token>(rng() % 200);
  auto c = test::make_plan_case(test::random_document_mask(S, rng), P, Heads{8, 2, dim, 2}, GridOptions{flat, 1},
                                stages, placement);
  run_pipeline(c, fmt::format("pipeline P={} stages={} D={} {}", P, stages, dim, flat ? "flattened" : "grouped"));
}

// MLA's shared latent (576 / 512, one kv head) on a range mask: the range
// args run as index rows on the tensor-core index programs.
void mla_range_pipeline_case(int P, int stages, std::uint64_t placement, int hq) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(P * 100 + stages * 10 + hq));
  const Token S = 128 * P + static_cast<Token>(rng() % 64);  // small: the CPU emulation runs it too
  auto c = test::make_plan_case(test::random_document_mask(S, rng), P, Heads{hq, 1, 576, 2, 512, true},
                                GridOptions{true, 1}, stages, placement);
  run_pipeline(c, fmt::format("MLA range pipeline P={} stages={} 576 / 512 (shared latent) heads {}:1, range args as "
                              "index rows",
                              P, stages, hq));
}

// Token top-k plans (index args): random per-head selections or the dsa generator.
// dim_v > 0: MLA with a shared latent (DSA: 576 / 512 over hkv = 1).
void index_pipeline_case(int P, int stages, int dim, bool dsa, std::uint64_t placement, int hq = 8, int dim_v = 0,
                         int hkv = 2) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(P * 1000 + stages * 10 + dim));
  const Token S = 400 * P + static_cast<Token>(rng() % 200);
  std::shared_ptr<const IndexMask> mask;
  if (dsa) {
    MaskSpec spec;
    spec.kind = MaskKind::dsa;
    spec.lengths = {S / 2, S / 3, S - S / 2 - S / 3};
    spec.topk = 96;
    spec.sink = 8;
    spec.local = 32;
    mask = std::make_shared<const IndexMask>(make_index_mask(spec, S));
  } else {
    mask = test::random_topk(S, 2, 40, rng);
  }
  auto c = test::make_index_plan_case(mask, P, Heads{hq, hkv, dim, 2, dim_v, dim_v > 0}, GridOptions{true, 1}, stages,
                                      placement);
  run_pipeline(c, fmt::format("top-k pipeline P={} stages={} D={}{} heads {}:{} {}", P, stages, dim,
                              dim_v > 0 ? fmt::format(" / {} (shared latent)", dim_v) : "", hq, hkv,
                              dsa ? "dsa" : "random per head"));
}

void run_pipeline(const test::PlanCase& c, const std::string& name) {
  const int P = c.plan.sharding.cp_size;
  const g::HeadLayout h = g::HeadLayout::of(*c.problem);
  std::vector<g::RankInputs> in;
  for (Rank r = 0; r < P; ++r) in.push_back(g::shard_inputs(*c.problem, c.plan.sharding, r, 3));
  g::HostWorld world(P);
  std::vector<g::RankOutputs> gpu(static_cast<std::size_t>(P));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(P));
  std::vector<std::thread> ts;
  for (Rank r = 0; r < P; ++r)
    ts.emplace_back([&, r] {
      try {
        auto be = g::make_cuda_loopback_backend(world, r, 0);
        g::RankPipeline pipe(*be, c.plan.ranks[static_cast<std::size_t>(r)], h, c.plan.sharding.rank_tokens(r).size(),
                             kernels_only());
        pipe.set_inputs(in[static_cast<std::size_t>(r)]);
        for (int it = 0; it < 2; ++it) {  // twice: accumulators must reset between iterations
          pipe.forward();
          pipe.backward();
          pipe.synchronize();
        }
        gpu[static_cast<std::size_t>(r)] = pipe.outputs();
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        world.abort(e.what());
      }
    });
  for (auto& t : ts) t.join();
  try {
    g::rethrow_first_cause(errors);
  } catch (const std::exception& e) {
    expect(false, name + ": " + e.what());
    return;
  }
  const g::EmulatedRun cpu = g::emulate(c.plan, h, in, g::Schedule::eager, kernels_only());
  double worst = 0;
  for (Rank r = 0; r < P; ++r) {
    const auto& a = gpu[static_cast<std::size_t>(r)];
    const auto& b = cpu.outputs[static_cast<std::size_t>(r)];
    for (auto [x, y] : {std::pair{&a.o, &b.o}, std::pair{&a.lse, &b.lse}, std::pair{&a.dq, &b.dq},
                        std::pair{&a.dk, &b.dk}, std::pair{&a.dv, &b.dv}})
      worst = std::max(worst, max_rel(*x, *y));
  }
  // The same programs, but fp32 results differ in the last bits (the device's exp, FMA contraction), and
  // partial O and gradients travel in bf16: one rounding can flip, by 2^-8 of the value, twice on a
  // relayed or multi-stage path (runtimes/cuda_nccl/README.md gives the measured differences).
  expect(worst < 8e-3, fmt::format("{}: GPU vs CPU twin max rel diff {:.2e}", name, worst));
  const g::CheckResult chk = g::check_against_sim(*c.problem, c.plan, gpu, 3, g::kDefaultTolerance);
  expect(chk.passed, name + ": " + chk.text);
}

void executor_single() {
  auto c = test::make_plan_case(test::generated_mask(MaskKind::causal, 1024), 1, Heads{8, 2, 128, 2}, GridOptions{}, 1, 0);
  Params p;
  p.set("launch", std::string("single"));
  p.set("attention", std::string("kernels"));
  p.set("check", true);
  p.set("iterations", std::int64_t{2});
  g::CudaNcclExecutor ex(p);
  ExecuteInput in;
  in.problem = c.problem;
  in.grid = c.grid;
  in.assignment = &c.assignment;
  in.plan = &c.plan;
  in.seed = 5;
  const ExecutionReport rep = ex.execute(in);
  std::printf("%s", rep.text.c_str());
  expect(rep.passed, "executor, one rank, launch single, self-check");
}

void ingestion() {
  std::mt19937_64 rng(9);
  const Token S = 20000;
  const RangeMask mask = test::random_document_mask(S, rng);
  auto problem = std::make_shared<const Problem>(Problem::make(mask, 8, Heads{8, 2, 64, 2}, GridOptions{true, 2}));
  const TaskGrid grid(problem);
  const auto slices = g::to_dev_slices(mask.slices());
  auto* d_slices = device_array<g::DevSlice>(slices.size());
  g::cuda::check(cudaMemcpy(d_slices, slices.data(), slices.size() * sizeof(g::DevSlice), cudaMemcpyHostToDevice), "copy");
  const g::cuda::IngestResult res = g::cuda::ingest_mask(d_slices, static_cast<int>(slices.size()), grid.sharding(), nullptr);
  cudaFree(d_slices);
  const int nb = grid.sharding().num_blocks();
  const auto cells = g::cells_from_records(res.records);
  bool same = cells.size() == grid.cells().size();
  for (std::size_t i = 0; same && i < cells.size(); ++i) {
    const Cell& w = grid.cells()[i];
    same = cells[i].qblock == w.qblock && cells[i].kblock == w.kblock && cells[i].area == w.area &&
           cells[i].rows == w.rows && cells[i].cols == w.cols &&
           res.cell_area[static_cast<std::size_t>(w.qblock) * static_cast<std::size_t>(nb) + static_cast<std::size_t>(w.kblock)] == w.area;
  }
  expect(same, fmt::format("device mask ingestion: {} slices, {} records, {} cells equal the TaskGrid", slices.size(),
                           res.records.size(), cells.size()));
}

// Device-side top-k counting equals count_index_cells (per head and merged),
// and a bad entry is named.
void topk_counting() {
  MaskSpec spec;
  spec.kind = MaskKind::dsa;
  spec.lengths = {9000, 3000, 8000};
  spec.topk = 256;
  spec.kv_heads = 2;
  const IndexMask m = make_index_mask(spec, 20000);
  auto problem = std::make_shared<const Problem>(
      Problem::make(std::make_shared<const IndexMask>(m), 8, Heads{8, 2, 64, 2}, GridOptions{true, 2}));
  const std::vector<Range>& blocks = problem->sharding.blocks;
  const auto idx = m.indices.span();
  auto* d_idx = device_array<std::int32_t>(idx.size());
  g::cuda::check(cudaMemcpy(d_idx, idx.data(), idx.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice), "copy");
  for (bool per_head : {true, false}) {
    const g::TopkDims d{m.seqlen, m.kv_heads, static_cast<int>(m.indices.shape[2]), m.causal, per_head};
    const std::vector<IndexCell> got = g::cuda::count_topk(d_idx, d, blocks, "dsa", nullptr);
    const std::vector<IndexCell> want = count_index_cells(m, blocks, IndexCountOptions{per_head, 0});
    bool same = got.size() == want.size();
    for (std::size_t i = 0; same && i < got.size(); ++i)
      same = got[i].head == want[i].head && got[i].qblock == want[i].qblock && got[i].kblock == want[i].kblock &&
             got[i].area == want[i].area && got[i].rows == want[i].rows && got[i].cols == want[i].cols;
    const std::vector<IndexCell> twin = g::count_topk_on_host(idx, d, blocks, "dsa");
    expect(same && twin.size() == got.size(),
           fmt::format("device top-k counting ({}): {} cells equal count_index_cells and the CPU twin",
                       per_head ? "per head" : "heads merged", got.size()));
  }
  const std::int32_t bad = 20000;
  g::cuda::check(cudaMemcpy(d_idx + 12345, &bad, sizeof bad, cudaMemcpyHostToDevice), "copy");
  std::string err;
  try {
    g::cuda::count_topk(d_idx, g::TopkDims{m.seqlen, m.kv_heads, static_cast<int>(m.indices.shape[2]), true, true},
                        blocks, "dsa", nullptr);
  } catch (const Error& e) {
    err = e.what();
  }
  const std::int64_t k = m.indices.shape[2];
  expect(err == fmt::format("dsa: indices[{}, {}, {}] = 20000 is outside [0, 20000)", 12345 / (2 * k), 12345 / k % 2,
                            12345 % k),
         "device top-k counting names a bad entry: " + err);
  cudaFree(d_idx);
}

}  // namespace

int main() {
  if (g::cuda_device_count() == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  try {
    pipeline_case(1, 1, 64, true, 0);
    pipeline_case(2, 1, 128, true, 5);
    pipeline_case(3, 2, 64, false, 7);
    pipeline_case(4, 2, 128, true, 11);
    executor_single();
    ingestion();
    index_pipeline_case(2, 1, 64, false, 3);
    index_pipeline_case(3, 2, 128, true, 5);
    index_pipeline_case(4, 2, 64, true, 0);
    index_pipeline_case(2, 2, 128, true, 9, 64);
    index_pipeline_case(2, 2, 576, true, 11, 128, 512, 1);  // DSA's MLA: 128 heads on one latent
    index_pipeline_case(3, 1, 576, true, 13, 16, 512, 1);
    mla_range_pipeline_case(1, 1, 0, 128);
    mla_range_pipeline_case(2, 2, 17, 16);
    topk_counting();
  } catch (const std::exception& e) {
    expect(false, std::string("exception: ") + e.what());
  }
  std::printf("%s\n", failures == 0 ? "all GPU kernel checks passed" : "GPU kernel checks FAILED");
  return failures == 0 ? 0 : 1;
}
