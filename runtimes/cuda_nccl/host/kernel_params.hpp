#pragma once
// Plain-data parameters of every kernel, shared by the CUDA launches and the
// CPU twins (no CUDA types; pointers are device pointers on the GPU and host
// pointers in the CPU emulation).
#include <cstdint>

#include "hd.hpp"
#include "mask_geometry.hpp"

namespace cpsched::gpu {

// Attention tiles: one CTA owns kTile rows (q-major) or cols (k-major) of a
// buffer, one per thread, and streams the other side kChunk at a time.
inline constexpr int kTile = 64;
inline constexpr int kChunk = 32;

// One attention arg as seen from one tile.
//
// Index args (plan.hpp's AttnArg::index_width > 0) have no band: each row
// (q-major) or col (k-major) reads its own list of the other side's rows.
//  q-major: row `r` of the q buffer attends to the k-buffer rows
//           AttnLaunch::indices[index_base + r * index_width + j], j < index_width, -1 skipped
//           (index_base = AttnArg::index_offset - q.begin * index_width);
//  k-major: col `c` of the k buffer is read by the q-buffer rows
//           AttnLaunch::t_rows[t_ptr[index_base + c] .. t_ptr[index_base + c + 1]), ascending
//           (the launch's transpose of the arg, built on the host once per plan).
struct WorkEntry {
  Band2 band;            // the arg's entries, buffer coordinates (rows: q buffer, cols: k buffer); index: the hull
  i64 major_b, major_e;  // rows (q-major) or cols (k-major) of the tile that hold entries
  i64 loop_b, loop_e;    // cols (q-major) or rows (k-major) the CTA streams
  std::int32_t group;    // head group (-1: all heads)
  std::int32_t other_buf;  // buffer of the streamed side: 0 local, 1 remote
  i64 index_base;          // index entries only (see above)
  std::int32_t index_width;  // > 0: an index entry
  std::int32_t pad;
};

// Tensors of one q-side buffer (local shard or remote QO buffer). A row holds
// `heads` heads (all q heads locally, one group's remotely); lse, delta: one
// float per head. Null where a pass does not use a tensor.
struct QSide {
  const bf16* q;
  const bf16* o;        // backward: final O
  const bf16* d_o;
  const float* lse;     // backward: final lse
  const float* delta;   // backward: rowsum(dO * O)
  float* o_acc;         // forward accumulators (normalised O, lse)
  float* lse_acc;
  float* dq_acc;
  i64 rows;
  std::int32_t heads;
  std::int32_t pad;
};

struct KSide {
  const bf16* k;
  const bf16* v;
  float* dk_acc;
  float* dv_acc;
  i64 rows;
  std::int32_t heads;
  std::int32_t pad;
};

// One attention launch: the tiles of one buffer (`major_buf`) of one stage.
struct AttnLaunch {
  QSide q[2];   // [local, remote]
  KSide k[2];
  const i64* tile_start;          // first row/col of each tile
  const std::int32_t* entry_begin;  // CSR over entries, num_tiles + 1
  const WorkEntry* entries;
  const std::int32_t* indices;    // the pass's CalcMeta::indices (q-major index entries)
  const i64* t_ptr;               // k-major index entries: the launch's transposes (CSR)
  const std::int32_t* t_rows;
  std::int32_t num_tiles;
  std::int32_t major_buf;         // 0 local, 1 remote
  std::int32_t hq, hkv, groups;   // problem heads (global)
  std::int32_t head_slots;        // grid y: heads per row of the major buffer
  float scale;                    // softmax scale 1/sqrt(D)
};

// Copy of `rows` rows of `row_bytes` bytes each between strided places (the
// pack of a group-cast: local rows, one head group, into a message).
struct CopySeg {
  const std::uint8_t* src;
  std::uint8_t* dst;
  i64 rows;
  i64 src_stride;  // bytes
  i64 dst_stride;
  i64 row_bytes;   // even
};

// lse-weighted merge of a received (O bf16, lse fp32) split into fp32
// accumulators: rows x heads, pointers at the first row and head.
struct MergeSeg {
  float* o_acc;
  float* lse_acc;
  const bf16* o;
  const float* lse;
  i64 rows;
  i64 acc_o_stride;    // floats per accumulator row
  i64 acc_lse_stride;
  std::int32_t heads;  // heads of the split (contiguous in the message)
  std::int32_t dim;
};

// Sum of a received bf16 split into fp32 accumulators: rows x width floats.
struct SumSeg {
  float* acc;
  const bf16* src;
  i64 rows;
  i64 acc_stride;  // floats per accumulator row
  i64 width;       // floats per row of the split (heads x dim)
};

}  // namespace cpsched::gpu
