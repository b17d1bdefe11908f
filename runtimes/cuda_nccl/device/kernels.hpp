#pragma once
#include <string>
// Launches of the CTA programs (host/programs/attention_programs.hpp,
// host/programs/data_programs.hpp, host/programs/mask_ingest.hpp) as CUDA kernels. All
// asynchronous on `stream`; errors of the launch itself throw cpsched::Error.
#include <cuda_runtime_api.h>
#include <vector>

#include "host/backend/backend.hpp"
#include "host/programs/mask_ingest.hpp"
#include "host/programs/topk_count.hpp"

namespace cpsched::gpu::cuda {

// Head dims with a kernel: 64 and 128.
bool has_attention_kernel(int dim);
// Why there are no CUDA kernels for these heads ("" when there are): GQA 64
// and 128; MLA's shared latent 576 / 512 on the index programs (its range
// args too, as index rows; range_args: the plan has range args on the range
// programs, which have no MLA instantiation).
std::string kernel_dims_lack(int dim, int dim_v, bool shared, bool range_args);
void attention(AttnKernel k, const AttnLaunch& p, int dim, int dim_v, Grid g, cudaStream_t s);
void index_attention(IndexKernel k, const IndexLaunch& p, int dim, int dim_v, Grid g, cudaStream_t s);
void copy(const CopySeg* segs, int n, cudaStream_t s);
void merge(const MergeSeg* segs, int n, cudaStream_t s);
void sum(const SumSeg* segs, int n, cudaStream_t s);
void convert(const float* src, bf16* dst, i64 n, cudaStream_t s);
void fill(float* dst, i64 n, float value, cudaStream_t s);
void delta(const bf16* o, const bf16* d_o, float* out, i64 row_heads, int dim, cudaStream_t s);

// Mask ingestion in two steps, all in device memory: counts then offsets
// (counts has n + 1 entries, counts[n] = number of records), then the records
// and the cell areas (nb x nb, zeroed by the caller).
void ingest_count(const DevSlice* slices, int n, const i64* bounds, int nb, i64* counts, cudaStream_t s);
void ingest_emit(const DevSlice* slices, int n, const i64* bounds, int nb, const i64* offsets, CellRecord* records,
                 i64* cell_area, cudaStream_t s);

// The whole ingestion of a mask already in device memory (`d_slices`, n
// slices) over the blocks of `sh`: per-cell areas and the (slice, cell)
// records, both computed on the device; only they come back (O(slices x
// touched cells) numbers, never per-token data). Synchronous on `s`.
struct IngestResult {
  std::vector<CellRecord> records;
  std::vector<i64> cell_area;  // nb x nb, row-major by q block
};
IngestResult ingest_mask(const DevSlice* d_slices, int n, const Sharding& sh, cudaStream_t s);

// Device-side counting of a token top-k selection (host/programs/topk_count.hpp):
// `d_idx` is the int32 [S, H, k] index tensor in device memory; the grid's
// cells over `blocks` (tiling [0, S)) come back, equal to count_index_cells.
// Only per-cell numbers and row/col runs cross to the host. Synchronous on
// `s`. Throws cpsched::Error naming `source` and the first entry outside
// [0, S) or after its query (causal); duplicates are not checked here.
std::vector<IndexCell> count_topk(const std::int32_t* d_idx, const TopkDims& dims, const std::vector<Range>& blocks,
                                  const std::string& source, cudaStream_t s);

// Throws cpsched::Error with `what` and CUDA's message.
void check(cudaError_t e, const char* what);

}  // namespace cpsched::gpu::cuda
