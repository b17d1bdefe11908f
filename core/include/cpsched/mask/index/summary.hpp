#pragma once
// Per-rank ingestion of a token top-k mask. In a run each rank holds only the
// indexer's output for its own queries, [S/P, H_kv, k]; gathering the whole
// [S, H_kv, k] tensor on every rank moves S x H_kv x k x 4 bytes per layer
// (1 GiB at S = 128k, k = 2048). Instead each rank counts its rows into the
// cells of its query blocks (area, rows, distinct keys: what the grid needs),
// the ranks exchange these summaries (one all-gather in a run, a loop in one
// process), and merging them gives exactly count_index_cells of the whole
// mask. Summaries are counted on fine blocks and coarsened to whichever
// sharding a solver picks, so one exchange serves every grid.
#include <cstdint>
#include <string>
#include <vector>

#include "cpsched/base/range.hpp"
#include "cpsched/mask/index/cells.hpp"
#include "cpsched/mask/index/index_mask.hpp"

namespace cpsched {

// One rank's rows of a token top-k mask over S tokens: `indices` (int32
// [rows, H_kv, k], -1 padded, global key positions) holds the queries
// [first_row, first_row + rows). The entries mean what IndexMask's do.
struct TopkRows {
  Token seqlen = 0;
  Token first_row = 0;
  bool causal = true;
  IndexArray indices;
  Range rows() const { return {first_row, first_row + (indices.shape.empty() ? 0 : indices.shape[0])}; }
};

// A whole mask's cells gathered from every rank's summary: what the grids
// of a problem need from a token top-k mask, without its indices
// (Problem::make of a summary).
struct IndexSummary {
  Token seqlen = 0;
  int kv_heads = 1;               // selection heads (1: one shared by every head)
  bool causal = true;
  std::vector<Range> blocks;      // the blocks the cells were counted on (tile [0, S))
  std::vector<IndexCell> cells;   // merge_index_cells of the ranks' summaries, counted per head
};

// One rank's own cells (its summary) with, per run of each cell's rows (a
// range of cells[i].rows: consecutive queries that select keys in the cell),
// the keys of the run's widest row inside the cell and the run's pairs. That
// is all a rank's index args are (plan.hpp: one arg per run, its rows padded
// to the widest) short of the keys themselves, so a plan made from the
// gathered summaries and these (Problem::make of row runs) leaves writing its
// index pool to the executor, which remaps the rank's rows where they live
// (cpsched.torch does it on the device): the host never reads the rank's
// S/P x k keys.
struct TopkRowRuns {
  Token seqlen = 0;
  int kv_heads = 1;
  bool causal = true;
  Range rows;                       // the rank's queries (one rank's shard)
  std::vector<IndexCell> cells;     // summarize_topk_rows of the rank's rows
  std::vector<std::int32_t> width;  // per run: cells in order, each cell's rows.ranges() in order
  std::vector<Token> area;          // per run: selected pairs
  std::size_t runs() const { return width.size(); }
};

// summarize_topk_rows of `rows`, and each run's widest row and pairs (the
// same validation and errors).
TopkRowRuns summarize_topk_runs(const TopkRows& rows, const std::vector<Range>& blocks, IndexCountOptions options = {});

// The cells of the query blocks that `rows` covers, equal to those cells of
// count_index_cells over the whole mask (same order: head, qblock, kblock).
// `blocks` tile [0, S); the rows must start and end on block boundaries (a
// rank's shard, or a multiple of its blocks). Validates the rows' entries as
// IndexMask::validate does the whole mask's; errors name the array's row and
// the query token, e.g.
//   "rank3.npy: indices[5, 0, 2] = 70000 (query token 12293) is outside [0, 65536)".
std::vector<IndexCell> summarize_topk_rows(const TopkRows& rows, const std::vector<Range>& blocks,
                                           IndexCountOptions options = {});

// Checks one rank's summary (another rank's, gathered) before it is merged:
// that it is what summarize_topk_rows gives for some valid rows of that rank.
// `blocks` tile [0, S) (the grid it was counted on); `rows` are the rank's
// queries (whole blocks). Cells strictly sorted by (head, qblock, kblock) (no
// cell twice), heads in [0, kv_heads), query blocks inside `rows`, key blocks
// in [0, blocks); each cell's rows inside its query block and its keys inside
// its key block, both non-empty, with causal no key after the cell's last row
// and none of its rows before its first key; its area between the fewest
// pairs those rows and keys need (every row selects a key, every key is
// selected) and the most they can hold (with causal: key <= query). Throws
// cpsched::Error starting with `where`, naming the cell, the field and the
// value, e.g.
//   "summaries[1] (rank 1's): cell 0 (head 0, qblock 1, kblock 0): area -5 is outside [32, 1024], ..."
void check_rank_summary(const std::vector<IndexCell>& cells, const std::vector<Range>& blocks, Range rows, int kv_heads,
                        bool causal, const std::string& where);

// The cells of several summaries over the same blocks as one list sorted by
// (head, qblock, kblock); cells with the same key (two summaries of the same
// rows) add their areas and unite their rows and keys. Merging every rank's
// summary gives count_index_cells of the whole mask.
std::vector<IndexCell> merge_index_cells(const std::vector<std::vector<IndexCell>>& parts);

// Cells counted on `fine` blocks as they are on `coarse` blocks, where every
// coarse block is a union of consecutive fine ones (both tile [0, S)): areas
// add, rows and keys unite. Throws cpsched::Error naming the first coarse
// boundary that is not a fine one.
std::vector<IndexCell> coarsen_index_cells(const std::vector<IndexCell>& cells, const std::vector<Range>& fine,
                                           const std::vector<Range>& coarse);

}  // namespace cpsched
