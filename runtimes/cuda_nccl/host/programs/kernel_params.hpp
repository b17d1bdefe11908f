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

// One range arg as seen from one tile (index args: IndexLaunch below).
struct WorkEntry {
  Band2 band;            // the arg's entries, buffer coordinates (rows: q buffer, cols: k buffer)
  i64 major_b, major_e;  // rows (q-major) or cols (k-major) of the tile that hold entries
  i64 loop_b, loop_e;    // cols (q-major) or rows (k-major) the CTA streams
  std::int32_t group;    // head group (-1: all heads)
  std::int32_t other_buf;  // buffer of the streamed side: 0 local, 1 remote
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

// v and dv_acc: `v_stride` elements per head of a row (d_v; d_qk when V is
// the first d_v dims of K's latent row, v == k and dv_acc == dk_acc).
struct KSide {
  const bf16* k;
  const bf16* v;
  float* dk_acc;
  float* dv_acc;
  i64 rows;
  std::int32_t heads;
  std::int32_t v_stride;
};

// One attention launch: the tiles of one buffer (`major_buf`) of one stage.
struct AttnLaunch {
  QSide q[2];   // [local, remote]
  KSide k[2];
  const i64* tile_start;          // first row/col of each tile
  const std::int32_t* entry_begin;  // CSR over entries, num_tiles + 1
  const WorkEntry* entries;
  std::int32_t num_tiles;
  std::int32_t major_buf;         // 0 local, 1 remote
  std::int32_t hq, hkv, groups;   // problem heads (global)
  std::int32_t head_slots;        // grid y: heads per row of the major buffer
  float scale;                    // softmax scale 1/sqrt(D)
};

// Index args on tensor cores (index_programs.hpp, index_worklist.hpp).
inline constexpr int kIndexColTile = 16;  // k-major: cols per CTA (the MMA's M)

// q-major item: one index arg's key list for one q-buffer row.
struct IndexQItem {
  i64 keys;                // the row's key list: pool entries [keys, keys + width)
  std::int32_t width;
  std::int32_t group;      // head group (-1: all heads)
  std::int32_t other_buf;  // k buffer: 0 local, 1 remote
  std::int32_t pad;
};

// k-major item: one index arg's q rows selecting a col of a 16-col tile.
struct IndexKItem {
  i64 first;               // union rows [first, first + count) of IndexLaunch::u_rows / u_masks
  std::int32_t count;
  std::int32_t group;
  std::int32_t other_buf;  // q buffer: 0 local, 1 remote
  std::int32_t pad;
};

// One index launch: CTA bx is q-buffer row major[bx] (q-major) or the 16 cols
// from major[bx] (k-major), grid y its kv head slot (and q-major's block of
// query heads: y = slot + slots * block).
struct IndexLaunch {
  QSide q[2];
  KSide k[2];
  const i64* major;
  const std::int32_t* begin;       // items of CTA bx: [begin[bx], begin[bx + 1])
  const IndexQItem* q_items;       // q-major
  const IndexKItem* k_items;       // k-major
  const std::int32_t* indices;     // q-major: the pass's pool
  const std::int32_t* u_rows;      // k-major: union rows and their col masks
  const std::uint32_t* u_masks;
  std::int32_t n;
  std::int32_t major_buf;          // 0 local, 1 remote
  std::int32_t hq, hkv, groups;    // problem heads (global)
  std::int32_t slots;              // kv heads per row of the major buffer's layout
  float scale;
  std::int32_t latent;             // 1: MLA's shared latent (V is K's first d_v dims; the kLatent programs)
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
