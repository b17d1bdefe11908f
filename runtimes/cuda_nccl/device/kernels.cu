// Every kernel of the runtime: one generic CTA runner instantiated for each
// program. The programs are the same code the CPU tests run (host/*.hpp).
// (No fmt here: its compile-time format checks do not pass nvcc's front end.)
#include <string>
#include <type_traits>

#include "cpsched/base/error.hpp"
#include "host/programs/attention_programs.hpp"
#include "host/programs/data_programs.hpp"
#include "host/programs/index_programs.hpp"
#include "host/programs/mask_ingest.hpp"
#include "host/programs/topk_count.hpp"
#include "kernels.hpp"

namespace cpsched::gpu::cuda {

namespace {

// The thread's view of a CTA: its own state, __syncthreads.
template <class State>
struct DeviceExec {
  State st;
  template <class F>
  CPSCHED_HD void each(F&& f) {
#if defined(__CUDA_ARCH__)
    f(static_cast<int>(threadIdx.x), st);
#endif
  }
  CPSCHED_HD void sync() {
#if defined(__CUDA_ARCH__)
    __syncthreads();
#endif
  }
  template <class F>
  CPSCHED_HD void warps(F&& f) {
#if defined(__CUDA_ARCH__)
    f(static_cast<int>(threadIdx.x) / 32);
#endif
  }
};

template <class Program>
__global__ void __launch_bounds__(Program::kThreads) run_cta(const Program prog) {
  // 128-byte aligned: WMMA tiles (tile_mma.hpp) need 32-byte aligned starts.
  extern __shared__ __align__(128) unsigned char smem_raw[];
  DeviceExec<typename Program::State> ex;
  prog(ex, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
       *reinterpret_cast<typename Program::Smem*>(smem_raw));
}

template <class Program>
void launch(const Program& prog, i64 grid_x, int grid_y, cudaStream_t s) {
  using Smem = typename Program::Smem;
  const std::size_t smem = std::is_empty_v<Smem> ? 0 : sizeof(Smem);
  if (grid_x <= 0 || grid_y <= 0) return;
  if (grid_x > 0x7fffffff || grid_y > 65535)
    throw Error("cuda_nccl: grid " + std::to_string(grid_x) + " x " + std::to_string(grid_y) +
                " exceeds the CUDA limits");
  // More than 48 KiB of dynamic shared memory needs an opt-in (once per
  // kernel; one device per process).
  static const cudaError_t configured =
      smem > 48 * 1024 ? cudaFuncSetAttribute(run_cta<Program>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem))
                       : cudaSuccess;
  check(configured, "cudaFuncSetAttribute(max dynamic shared memory)");
  run_cta<Program><<<dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y)), Program::kThreads, smem, s>>>(
      prog);
  check(cudaGetLastError(), "kernel launch");
}

template <template <int, int> class Prog>
void attention_dim(const AttnLaunch& p, int dim, Grid g, cudaStream_t s) {
  switch (dim) {
    case 64: launch(Prog<64, 64>{p}, g.x, g.y, s); return;
    case 128: launch(Prog<128, 128>{p}, g.x, g.y, s); return;
    default: break;
  }
  throw Error("cuda_nccl: head dim " + std::to_string(dim) + " has no CUDA kernel (built: 64, 128)");
}

}  // namespace

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(std::string("cuda_nccl: ") + what + ": " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")");
}

bool has_attention_kernel(int dim) { return dim == 64 || dim == 128; }

std::string kernel_dims_lack(int dim, int dim_v, bool shared, bool range_args) {
  if (dim == dim_v && !shared)
    return has_attention_kernel(dim) ? "" : "cuda_nccl: head dim " + std::to_string(dim) + " has no CUDA kernel (built: 64, 128)";
  if (dim == 576 && dim_v == 512 && shared && !range_args) return "";
  return "cuda_nccl: MLA heads (d_qk " + std::to_string(dim) + ", d_v " + std::to_string(dim_v) +
         (shared ? ", shared latent" : "") + ")" +
         (dim == 576 && dim_v == 512 && shared ? " with range args on the range programs" : "") +
         ": the CUDA kernels take MLA only as DSA has it (a shared latent of 576 / 512, on the index programs; "
         "range args as index rows); run it with backend: emulate";
}

namespace {

// Index programs: MT (16-head tiles per block) by the query heads per kv head.
template <int D>
void index_dim(IndexKernel k, const IndexLaunch& p, Grid g, cudaStream_t s) {
  const bool wide = index_mt(p.hq / p.hkv, D) > 1;
  switch (k) {
    case IndexKernel::fwd:
      if (wide) launch(IndexFwdProgram<D, D, 4>{p}, g.x, g.y, s);
      else launch(IndexFwdProgram<D, D, 1>{p}, g.x, g.y, s);
      return;
    case IndexKernel::dq:
      if (wide) launch(IndexDqProgram<D, D, 4>{p}, g.x, g.y, s);
      else launch(IndexDqProgram<D, D, 1>{p}, g.x, g.y, s);
      return;
    case IndexKernel::dkdv: launch(IndexDkvProgram<D, D>{p}, g.x, g.y, s); return;
  }
}

// MLA: DSA's shared latent, 576 / 512, on the index programs (range args as
// index rows; kernel_dims_lack refuses the rest before any buffer; these are
// the backstops).
void refuse_mla(int dim, int dim_v) {
  throw Error("cuda_nccl: MLA head dims (d_qk " + std::to_string(dim) + ", d_v " + std::to_string(dim_v) +
              ") have no CUDA kernel for this arg; run them with backend: emulate");
}

// DSA's latent: 32 heads per block over 16 (index_mt), half steps (index_step).
void index_mla(IndexKernel k, const IndexLaunch& p, Grid g, cudaStream_t s) {
  const bool wide = index_mt(p.hq / p.hkv, 576) > 1;
  switch (k) {
    case IndexKernel::fwd:
      if (wide) launch(IndexFwdProgram<576, 512, 2, true>{p}, g.x, g.y, s);
      else launch(IndexFwdProgram<576, 512, 1, true>{p}, g.x, g.y, s);
      return;
    case IndexKernel::dq:
      if (wide) launch(IndexDqProgram<576, 512, 2, true>{p}, g.x, g.y, s);
      else launch(IndexDqProgram<576, 512, 1, true>{p}, g.x, g.y, s);
      return;
    case IndexKernel::dkdv: launch(IndexDkvProgram<576, 512, true>{p}, g.x, g.y, s); return;
  }
}

}  // namespace

void index_attention(IndexKernel k, const IndexLaunch& p, int dim, int dim_v, Grid g, cudaStream_t s) {
  if (dim == 576 && dim_v == 512 && p.latent != 0) return index_mla(k, p, g, s);
  if (dim != dim_v || p.latent != 0) refuse_mla(dim, dim_v);
  switch (dim) {
    case 64: index_dim<64>(k, p, g, s); return;
    case 128: index_dim<128>(k, p, g, s); return;
    default: break;
  }
  throw Error("cuda_nccl: head dim " + std::to_string(dim) + " has no index kernel (built: 64, 128)");
}

void attention(AttnKernel k, const AttnLaunch& p, int dim, int dim_v, Grid g, cudaStream_t s) {
  if (dim != dim_v) refuse_mla(dim, dim_v);
  switch (k) {
    case AttnKernel::fwd: attention_dim<FwdProgram>(p, dim, g, s); return;
    case AttnKernel::dq: attention_dim<DqProgram>(p, dim, g, s); return;
    case AttnKernel::dkdv: attention_dim<DkvProgram>(p, dim, g, s); return;
  }
}

void copy(const CopySeg* segs, int n, cudaStream_t s) { launch(CopyProgram{segs}, n, 1, s); }
void merge(const MergeSeg* segs, int n, cudaStream_t s) { launch(MergeProgram{segs}, n, 1, s); }
void sum(const SumSeg* segs, int n, cudaStream_t s) { launch(SumProgram{segs}, n, 1, s); }

void convert(const float* src, bf16* dst, i64 n, cudaStream_t s) {
  if (n <= 0) return;
  const int c = grid_stride_ctas(n);
  launch(ConvertProgram{src, dst, n, c}, c, 1, s);
}

void fill(float* dst, i64 n, float value, cudaStream_t s) {
  if (n <= 0) return;
  const int c = grid_stride_ctas(n);
  launch(FillProgram{dst, n, value, c}, c, 1, s);
}

void delta(const bf16* o, const bf16* d_o, float* out, i64 row_heads, int dim, cudaStream_t s) {
  if (row_heads <= 0) return;
  const int c = grid_stride_ctas(row_heads);
  launch(DeltaProgram{o, d_o, out, row_heads, dim, c}, c, 1, s);
}

void ingest_count(const DevSlice* slices, int n, const i64* bounds, int nb, i64* counts, cudaStream_t s) {
  if (n <= 0) return;
  launch(IngestCount{slices, n, bounds, nb, counts}, (n + kDataThreads - 1) / kDataThreads, 1, s);
  launch(IngestScan{counts, n}, 1, 1, s);
}

void ingest_emit(const DevSlice* slices, int n, const i64* bounds, int nb, const i64* offsets, CellRecord* records,
                 i64* cell_area, cudaStream_t s) {
  if (n <= 0) return;
  launch(IngestEmit{slices, n, bounds, nb, offsets, records, cell_area}, (n + kDataThreads - 1) / kDataThreads, 1, s);
}

IngestResult ingest_mask(const DevSlice* d_slices, int n, const Sharding& sh, cudaStream_t s) {
  const std::vector<i64> bounds = block_bounds(sh);
  const int nb = sh.num_blocks();
  IngestResult out;
  out.cell_area.assign(static_cast<std::size_t>(nb) * static_cast<std::size_t>(nb), 0);
  if (n <= 0 || nb <= 0) return out;
  // Scratch: bounds, counts/offsets, areas, then the records once their number is known.
  void *d_bounds = nullptr, *d_counts = nullptr, *d_area = nullptr, *d_rec = nullptr;
  auto release = [&] {
    for (void* p : {d_bounds, d_counts, d_area, d_rec})
      if (p != nullptr) cudaFree(p);
  };
  try {
    check(cudaMalloc(&d_bounds, bounds.size() * sizeof(i64)), "cudaMalloc(ingest bounds)");
    check(cudaMalloc(&d_counts, (static_cast<std::size_t>(n) + 1) * sizeof(i64)), "cudaMalloc(ingest counts)");
    check(cudaMalloc(&d_area, out.cell_area.size() * sizeof(i64)), "cudaMalloc(ingest areas)");
    check(cudaMemcpyAsync(d_bounds, bounds.data(), bounds.size() * sizeof(i64), cudaMemcpyHostToDevice, s),
          "cudaMemcpy(ingest bounds)");
    check(cudaMemsetAsync(d_area, 0, out.cell_area.size() * sizeof(i64), s), "cudaMemset(ingest areas)");
    ingest_count(d_slices, n, static_cast<const i64*>(d_bounds), nb, static_cast<i64*>(d_counts), s);
    i64 total = 0;
    check(cudaMemcpyAsync(&total, static_cast<i64*>(d_counts) + n, sizeof(i64), cudaMemcpyDeviceToHost, s),
          "cudaMemcpy(ingest total)");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize(ingest)");
    out.records.resize(static_cast<std::size_t>(total));
    if (total > 0) {
      check(cudaMalloc(&d_rec, out.records.size() * sizeof(CellRecord)), "cudaMalloc(ingest records)");
      ingest_emit(d_slices, n, static_cast<const i64*>(d_bounds), nb, static_cast<const i64*>(d_counts),
                  static_cast<CellRecord*>(d_rec), static_cast<i64*>(d_area), s);
      check(cudaMemcpyAsync(out.records.data(), d_rec, out.records.size() * sizeof(CellRecord), cudaMemcpyDeviceToHost,
                            s),
            "cudaMemcpy(ingest records)");
    }
    check(cudaMemcpyAsync(out.cell_area.data(), d_area, out.cell_area.size() * sizeof(i64), cudaMemcpyDeviceToHost, s),
          "cudaMemcpy(ingest areas)");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize(ingest)");
  } catch (...) {
    release();
    throw;
  }
  release();
  return out;
}

std::vector<IndexCell> count_topk(const std::int32_t* d_idx, const TopkDims& dims, const std::vector<Range>& blocks,
                                  const std::string& source, cudaStream_t s) {
  const std::vector<i64> bounds = topk_count_bounds(dims, blocks);
  const int nb = static_cast<int>(blocks.size()), ch = dims.per_head ? dims.heads : 1;
  const i64 words = (dims.seqlen + 31) / 32, rows = dims.seqlen * dims.heads;
  const i64 cells = static_cast<i64>(ch) * nb * nb;
  const std::size_t bitmap = static_cast<std::size_t>(ch) * static_cast<std::size_t>(nb) * static_cast<std::size_t>(words);
  TopkCountRaw raw;
  raw.area.resize(static_cast<std::size_t>(cells));
  raw.row_runs.resize(static_cast<std::size_t>(cells));
  raw.offsets.resize(static_cast<std::size_t>(cells) + 1);
  // Scratch: bounds, areas, the two bitmaps, the bad entry, counts/offsets, row runs, then the runs.
  void *d_bounds = nullptr, *d_area = nullptr, *d_cols = nullptr, *d_rows = nullptr, *d_bad = nullptr,
       *d_counts = nullptr, *d_row_runs = nullptr, *d_runs = nullptr;
  auto release = [&] {
    for (void** p : {&d_bounds, &d_area, &d_cols, &d_rows, &d_bad, &d_counts, &d_row_runs, &d_runs})
      if (*p != nullptr) {
        cudaFree(*p);
        *p = nullptr;
      }
  };
  try {
    check(cudaMalloc(&d_bounds, bounds.size() * sizeof(i64)), "cudaMalloc(top-k bounds)");
    check(cudaMalloc(&d_area, raw.area.size() * sizeof(i64)), "cudaMalloc(top-k areas)");
    check(cudaMalloc(&d_cols, bitmap * sizeof(std::uint32_t)), "cudaMalloc(top-k key bitmap)");
    check(cudaMalloc(&d_rows, bitmap * sizeof(std::uint32_t)), "cudaMalloc(top-k query bitmap)");
    check(cudaMalloc(&d_bad, sizeof(i64)), "cudaMalloc(top-k bad entry)");
    check(cudaMalloc(&d_counts, raw.offsets.size() * sizeof(i64)), "cudaMalloc(top-k counts)");
    check(cudaMalloc(&d_row_runs, raw.row_runs.size() * sizeof(i64)), "cudaMalloc(top-k row runs)");
    const i64 no_bad = kNoBadEntry;
    check(cudaMemcpyAsync(d_bounds, bounds.data(), bounds.size() * sizeof(i64), cudaMemcpyHostToDevice, s),
          "cudaMemcpy(top-k bounds)");
    check(cudaMemcpyAsync(d_bad, &no_bad, sizeof(i64), cudaMemcpyHostToDevice, s), "cudaMemcpy(top-k bad entry)");
    check(cudaMemsetAsync(d_area, 0, raw.area.size() * sizeof(i64), s), "cudaMemset(top-k areas)");
    check(cudaMemsetAsync(d_cols, 0, bitmap * sizeof(std::uint32_t), s), "cudaMemset(top-k key bitmap)");
    check(cudaMemsetAsync(d_rows, 0, bitmap * sizeof(std::uint32_t), s), "cudaMemset(top-k query bitmap)");
    const TopkCount c{d_idx, dims.seqlen, dims.heads, dims.k, dims.causal ? 1 : 0, ch,
                      static_cast<const i64*>(d_bounds), nb, 0, words, static_cast<i64*>(d_area),
                      static_cast<std::uint32_t*>(d_cols), static_cast<std::uint32_t*>(d_rows), static_cast<i64*>(d_bad)};
    launch(TopkMark{c}, (rows + kDataThreads - 1) / kDataThreads, 1, s);
    check(cudaMemcpyAsync(&raw.bad, d_bad, sizeof(i64), cudaMemcpyDeviceToHost, s), "cudaMemcpy(top-k bad entry)");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize(top-k mark)");
    if (raw.bad != kNoBadEntry) {
      check(cudaMemcpy(&raw.bad_value, d_idx + raw.bad, sizeof(std::int32_t), cudaMemcpyDeviceToHost),
            "cudaMemcpy(top-k bad value)");
      release();
      return topk_cells_from_raw(raw, dims, nb, source);  // throws
    }
    const i64 ctas = (cells + kDataThreads - 1) / kDataThreads;
    launch(TopkRunCount{c, static_cast<i64*>(d_counts), static_cast<i64*>(d_row_runs)}, ctas, 1, s);
    launch(IngestScan{static_cast<i64*>(d_counts), static_cast<int>(cells)}, 1, 1, s);
    check(cudaMemcpyAsync(raw.offsets.data(), d_counts, raw.offsets.size() * sizeof(i64), cudaMemcpyDeviceToHost, s),
          "cudaMemcpy(top-k offsets)");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize(top-k scan)");
    raw.runs.resize(static_cast<std::size_t>(raw.offsets.back()));
    if (!raw.runs.empty()) {
      check(cudaMalloc(&d_runs, raw.runs.size() * sizeof(Iv)), "cudaMalloc(top-k runs)");
      launch(TopkRunEmit{c, static_cast<const i64*>(d_counts), static_cast<Iv*>(d_runs)}, ctas, 1, s);
      check(cudaMemcpyAsync(raw.runs.data(), d_runs, raw.runs.size() * sizeof(Iv), cudaMemcpyDeviceToHost, s),
            "cudaMemcpy(top-k runs)");
    }
    check(cudaMemcpyAsync(raw.area.data(), d_area, raw.area.size() * sizeof(i64), cudaMemcpyDeviceToHost, s),
          "cudaMemcpy(top-k areas)");
    check(cudaMemcpyAsync(raw.row_runs.data(), d_row_runs, raw.row_runs.size() * sizeof(i64), cudaMemcpyDeviceToHost, s),
          "cudaMemcpy(top-k row runs)");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize(top-k counting)");
  } catch (...) {
    release();
    throw;
  }
  release();
  return topk_cells_from_raw(raw, dims, nb, source);
}

}  // namespace cpsched::gpu::cuda
