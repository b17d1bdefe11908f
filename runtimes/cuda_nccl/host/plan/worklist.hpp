#pragma once
// Launch parameters of the attention kernels, from a stage's attention args.
//
// A q-major launch (forward, dQ) covers the tiles of kTile rows of one q
// buffer: every arg is cut into the tiles its rows touch, and each piece
// records the rows of the tile it covers and the cols it needs (the O(1)
// closed forms of mask_geometry.hpp), so a CTA streams exactly those cols.
// A k-major launch (dK, dV) is the transpose over kTile cols of a k buffer.
// Entries of one tile keep the args' order: results are deterministic.
//
// Index args (token top-k) are not listed here: index_worklist.hpp builds
// their launches (tensor-core programs), and those of MLA's range args too
// (as index rows; the pipeline then builds no range launches).
#include <span>
#include <vector>

#include "cpsched/plan/plan.hpp"
#include "host/programs/kernel_params.hpp"

namespace cpsched::gpu {

struct WorkList {
  std::vector<i64> tile_start;            // ascending
  std::vector<std::int32_t> entry_begin;  // size tiles + 1
  std::vector<WorkEntry> entries;
  i64 area = 0;                           // unmasked entries covered (per head)

  int num_tiles() const { return static_cast<int>(tile_start.size()); }
  bool empty() const { return tile_start.empty(); }
};

Band2 band_of(const AttnArg& a);

// Range args whose q buffer is `q_buf`, tiled over their q rows.
WorkList q_major(std::span<const AttnArg> args, BufferId q_buf);
// Range args whose k buffer is `k_buf`, tiled over their k cols.
WorkList k_major(std::span<const AttnArg> args, BufferId k_buf);

// Grid of a launch: x = tiles, y = head slots (heads per row of the tiled buffer).
struct Grid {
  int x = 0;
  int y = 0;
  int threads = kTile;
};
Grid grid_of(const WorkList& w, int head_slots);

}  // namespace cpsched::gpu
