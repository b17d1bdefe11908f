// Every kernel of the runtime: one generic CTA runner instantiated for each
// program. The programs are the same code the CPU tests run (host/*.hpp).
// (No fmt here: its compile-time format checks do not pass nvcc's front end.)
#include <string>
#include <type_traits>

#include "cpsched/error.hpp"
#include "host/attention_programs.hpp"
#include "host/data_programs.hpp"
#include "host/mask_ingest.hpp"
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
};

template <class Program>
__global__ void __launch_bounds__(Program::kThreads) run_cta(const Program prog) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
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

template <template <int> class Prog>
void attention_dim(const AttnLaunch& p, int dim, Grid g, cudaStream_t s) {
  switch (dim) {
    case 64: launch(Prog<64>{p}, g.x, g.y, s); return;
    case 128: launch(Prog<128>{p}, g.x, g.y, s); return;
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

void attention(AttnKernel k, const AttnLaunch& p, int dim, Grid g, cudaStream_t s) {
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

}  // namespace cpsched::gpu::cuda
