#pragma once
// Launch lists of the index kernels (index_programs.hpp): token top-k args
// (plan.hpp's AttnArg::index_width > 0), on tensor cores.
//
// q-major (forward, dQ): one CTA per q-buffer row with selected keys (and kv
// head, and block of up to 64 of its query heads). Its items are the index
// args covering the row, in arg order, each pointing at the row's key list
// in the pass's pool: the CTA runs them all with one online softmax (or dQ
// accumulator), so each row's result is written once, in a fixed order.
//
// k-major (dK, dV): one CTA per tile of 16 consecutive k-buffer cols (16-
// aligned) that some row selects. Its items are the args selecting a col of
// the tile, each with the union of the q rows selecting any of its 16 cols,
// ascending, and per row a 16-bit mask of the cols it selects: the MMA rows
// are the (row, head) pairs, the MMA cols the tile's keys. Built on the host
// once per plan; every gradient is summed in a fixed order, without atomics.
//
// Checked here: offsets inside the pool, every key -1 or inside the arg's
// hull (the kernels index K / V rows without bounds checks), no key twice in
// a row (the masks could not count it twice).
//
// Range args as index rows (MLA, sdpa_batches.hpp's range_args_as_index_rows):
// row q of a range arg selects the cols row_cols(band, q), one interval, so
// its key list is a window of an ascending run 0, 1, ..., n - 1 that the pass
// appends to its pool (at `rows_at`; n covers every range arg's k rows): no
// key list per row. q-major cuts each row's interval into items of at most
// kIndexRowKeys keys (the row's CTA runs them with the one online softmax, so
// they merge by LSE as the args on a row do); k-major gives each 16-col tile
// the arg's rows reaching it, with their col masks. Range args join the index
// args in arg order; without `rows_at` (< 0) they are left out (GQA: the
// range programs or cuDNN take them).
#include <span>
#include <vector>

#include "cpsched/plan/plan.hpp"
#include "host/programs/kernel_params.hpp"

namespace cpsched::gpu {

// q-major: row `rows[i]` has items [begin[i], begin[i + 1]) (kernel_params.hpp's IndexQItem).
struct IndexQList {
  std::vector<i64> rows;              // ascending
  std::vector<std::int32_t> begin;    // rows + 1
  std::vector<IndexQItem> items;
  i64 area = 0;                       // selected pairs (per head)
  bool empty() const { return rows.empty(); }
};

// k-major: tile `tiles[i]` (first col, a multiple of 16) has items [begin[i], begin[i + 1]).
struct IndexKList {
  std::vector<i64> tiles;
  std::vector<std::int32_t> begin;
  std::vector<IndexKItem> items;
  std::vector<std::int32_t> rows;     // q-buffer rows
  std::vector<std::uint32_t> masks;   // bit c: the row selects col tile + c
  i64 area = 0;
  bool empty() const { return tiles.empty(); }
};

// The index args of `args` whose q buffer is `q_buf` (q-major) / whose k
// buffer is `k_buf` (k-major). Throws cpsched::Error naming a bad entry.
inline constexpr std::int32_t kIndexRowKeys = 2048;
IndexQList index_q_major(std::span<const AttnArg> args, BufferId q_buf, std::span<const std::int32_t> indices,
                         i64 rows_at = -1);
IndexKList index_k_major(std::span<const AttnArg> args, BufferId k_buf, std::span<const std::int32_t> indices,
                         bool range_rows = false);

}  // namespace cpsched::gpu
