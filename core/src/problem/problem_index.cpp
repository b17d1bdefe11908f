// Problems of index masks (problem.hpp).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "cpsched/base/error.hpp"
#include "cpsched/problem/problem.hpp"
#include "problem/index_problem.hpp"

namespace cpsched {

Problem Problem::make(std::shared_ptr<const IndexMask> mask, int cp_size, Heads heads, GridOptions grid) {
  return make_index_problem(std::move(mask), cp_size, heads, grid, /*validated=*/false);
}

Problem make_index_problem(std::shared_ptr<const IndexMask> mask, int cp_size, Heads heads, GridOptions grid,
                           bool validated) {
  if (!mask) throw Error("problem: no index mask given");
  // The array that says how many heads select (its source: a file path, or <indices> for memory).
  const IndexArray& heads_array = mask->kind == IndexMaskKind::bsr && !mask->indptr.empty() ? mask->indptr : mask->indices;
  const std::string src = heads_array.source.empty() ? std::string("<indices>") : heads_array.source;
  if (mask->kv_heads != 1 && mask->kv_heads != heads.kv)
    throw Error(heads.kv == 1
                    ? fmt::format("{}: the index mask (shape [{}]) selects for {} KV heads but heads.kv = 1: with one "
                                  "KV head the selection has one head",
                                  src, fmt::join(heads_array.shape, ", "), mask->kv_heads)
                    : fmt::format("{}: the index mask (shape [{}]) selects for {} KV heads but heads.kv = {}: a "
                                  "selection is shared by all heads (1 head) or one per KV head ({} heads)",
                                  src, fmt::join(heads_array.shape, ", "), mask->kv_heads, heads.kv, heads.kv));
  if (mask->kv_heads > 1 && !grid.flatten_head_groups)
    throw Error(fmt::format("problem: the index mask selects per KV head ({} heads), which needs flattened head "
                            "groups (problem.grid.flatten_head_groups: true)",
                            mask->kv_heads));
  // Every block of the grid holds tokens (the index cells tile [0, S) by blocks).
  if (cp_size >= 1 && grid.blocks_per_rank >= 1 &&
      mask->seqlen < std::int64_t{cp_size} * grid.blocks_per_rank)
    throw Error(fmt::format("problem: the index mask has S = {} tokens, fewer than the {} blocks of the grid (cp_size "
                            "{} x blocks_per_rank {}): every rank's block needs at least one token",
                            mask->seqlen, std::int64_t{cp_size} * grid.blocks_per_rank, cp_size,
                            grid.blocks_per_rank));
  // The problem without its selection: `mask` holds only S.
  auto shell = [&] {
    Problem p;
    p.heads = heads;
    p.grid = grid;
    p.sharding = Sharding::sequential(mask->seqlen, cp_size, grid.blocks_per_rank);
    p.mask = RangeMask(mask->seqlen, {});
    return p;
  };
  const std::string isrc = mask->indices.source.empty() ? std::string("<indices>") : mask->indices.source;
  auto empty = [&] {
    return Error(fmt::format("{}: the {} selection (shape [{}]) selects no (query, key) pair: nothing to plan", isrc,
                             to_string(mask->kind), fmt::join(mask->indices.shape, ", ")));
  };
  if (mask->kind == IndexMaskKind::topk) {
    if (!validated) mask->validate();
    // Valid entries are -1 or a selected key: the selection is empty when all are -1.
    const auto e = mask->indices.span();
    if (std::all_of(e.begin(), e.end(), [](std::int32_t v) { return v == -1; })) throw empty();
    Problem p = shell();
    p.index_mask = std::move(mask);
    p.selection_rows = std::make_shared<const SelectionRowsCache>();
    p.validate();
    return p;
  }
  std::vector<RangeMask> per_head = block_selection_masks(*mask);  // validates the entries
  __int128 area = 0;
  for (const RangeMask& m : per_head) area += m.area_wide();
  if (area == 0) throw empty();
  if (per_head.size() == 1) return Problem::make(std::move(per_head.front()), cp_size, heads, grid);
  Problem p = shell();
  p.head_masks = std::move(per_head);
  for (const RangeMask& m : p.head_masks) m.validate();
  p.validate();
  return p;
}

namespace {

// A problem of the ranks' gathered summary, without the rank's own part yet:
// the summary checked against the problem's blocks and heads.
Problem summary_problem(const std::shared_ptr<const IndexSummary>& summary, int cp_size, Heads heads, GridOptions grid) {
  if (!summary) throw Error("problem: no index summary given");
  const IndexSummary& s = *summary;
  const Token S = s.seqlen;
  if (S < 1) throw Error(fmt::format("problem: the index summary has S = {} tokens (must be >= 1)", S));
  if (cp_size < 1) throw Error(fmt::format("problem: cp_size must be at least 1, got {}", cp_size));
  if (s.kv_heads != 1 && s.kv_heads != heads.kv)
    throw Error(fmt::format("problem: the index summary selects for {} KV heads but heads.kv = {}: a selection is "
                            "shared by all heads (1 head) or one per KV head",
                            s.kv_heads, heads.kv));
  if (s.kv_heads > 1 && !grid.flatten_head_groups)
    throw Error(fmt::format("problem: the index summary selects per KV head ({} heads), which needs flattened head "
                            "groups (problem.grid.flatten_head_groups: true)",
                            s.kv_heads));
  if (grid.blocks_per_rank >= 1 && S < std::int64_t{cp_size} * grid.blocks_per_rank)
    throw Error(fmt::format("problem: the index summary has S = {} tokens, fewer than the {} blocks of the grid", S,
                            std::int64_t{cp_size} * grid.blocks_per_rank));
  Problem p;
  p.heads = heads;
  p.grid = grid;
  p.sharding = Sharding::sequential(S, cp_size, grid.blocks_per_rank);
  p.mask = RangeMask(S, {});
  // The grid's blocks must be unions of the summary's (TaskGrid coarsens them).
  coarsen_index_cells({}, s.blocks, p.sharding.blocks);
  const std::int64_t nb = static_cast<std::int64_t>(s.blocks.size());
  __int128 total = 0;
  for (const IndexCell& c : s.cells) {
    if (c.head < 0 || c.head >= s.kv_heads || c.qblock < 0 || c.qblock >= nb || c.kblock < 0 || c.kblock >= nb)
      throw Error(fmt::format("problem: the index summary's cell (head {}, qblock {}, kblock {}) is outside its {} "
                              "heads and {} blocks",
                              c.head, c.qblock, c.kblock, s.kv_heads, nb));
    total += c.area;
  }
  if (total == 0) throw Error("problem: the index summary selects no (query, key) pair: nothing to plan");
  return p;
}

// Checks that `mine` (the rows of `src`) is one rank's shard of the summary's
// sequence.
void check_own_shard(const IndexSummary& s, const std::string& src, Token seqlen, Range mine, int cp_size) {
  if (seqlen != s.seqlen)
    throw Error(fmt::format("{}: the rank's rows are of a sequence of S = {} tokens, the summary's of {}", src, seqlen,
                            s.seqlen));
  const Sharding ranks = Sharding::sequential(s.seqlen, cp_size, 1);
  if (std::find(ranks.blocks.begin(), ranks.blocks.end(), mine) == ranks.blocks.end())
    throw Error(fmt::format("{}: the rows [{}, {}) are not one rank's shard of S = {} over {} ranks", src, mine.begin,
                            mine.end, s.seqlen, cp_size));
}

bool in_rows(const IndexSummary& s, const IndexCell& c, Range mine) {
  const Range q = s.blocks[static_cast<std::size_t>(c.qblock)];
  return q.begin >= mine.begin && q.end <= mine.end;
}

}  // namespace

Problem Problem::make(std::shared_ptr<const IndexSummary> summary, const TopkRows& own_rows, int cp_size, Heads heads,
                     GridOptions grid, BufferRecycler* buffers) {
  Problem p = summary_problem(summary, cp_size, heads, grid);
  const IndexSummary& s = *summary;
  // This rank's rows: one rank's shard, the rows it summarised.
  const std::string src = own_rows.indices.source.empty() ? std::string("<indices>") : own_rows.indices.source;
  const Range mine = own_rows.rows();
  check_own_shard(s, src, own_rows.seqlen, mine, cp_size);
  if (own_rows.indices.shape.size() != 3 || own_rows.indices.shape[1] != s.kv_heads)
    throw Error(fmt::format("{}: the rank's rows have shape [{}], not [rows, {} (the summary's KV heads), k]", src,
                            fmt::join(own_rows.indices.shape, ", "), s.kv_heads));
  auto rows = std::make_unique<const SelectionRows>(own_rows, 0, buffers);
  Token mine_area = 0;
  for (const IndexCell& c : s.cells)
    if (in_rows(s, c, mine)) mine_area += c.area;
  if (mine_area != rows->keys())
    throw Error(fmt::format("{}: the rank's rows [{}, {}) select {} keys but the gathered summary gives them {}: the "
                            "summary is not of these rows",
                            src, mine.begin, mine.end, rows->keys(), mine_area));
  p.index_summary = std::move(summary);
  p.selection_rows = std::make_shared<const SelectionRowsCache>(std::move(rows));
  p.validate();
  return p;
}

Problem Problem::make(std::shared_ptr<const IndexSummary> summary, std::shared_ptr<const TopkRowRuns> own_runs,
                     int cp_size, Heads heads, GridOptions grid) {
  Problem p = summary_problem(summary, cp_size, heads, grid);
  if (!own_runs) throw Error("problem: no row runs given");
  const IndexSummary& s = *summary;
  const TopkRowRuns& r = *own_runs;
  const std::string src = "row runs";
  check_own_shard(s, src, r.seqlen, r.rows, cp_size);
  if (r.kv_heads != s.kv_heads)
    throw Error(fmt::format("{}: they select for {} KV heads, the summary for {}", src, r.kv_heads, s.kv_heads));
  if (r.causal != s.causal)
    throw Error(fmt::format("{}: causal is {}, the summary's {}", src, r.causal, s.causal));
  std::size_t ranges = 0;
  for (const IndexCell& c : r.cells) ranges += c.rows.ranges().size();
  if (r.width.size() != ranges || r.area.size() != ranges)
    throw Error(fmt::format("{}: {} widths and {} areas for the {} runs of their cells' rows", src, r.width.size(),
                            r.area.size(), ranges));
  // The runs' cells are the summary's cells of the rank's query blocks.
  std::vector<const IndexCell*> mine;
  for (const IndexCell& c : s.cells)
    if (in_rows(s, c, r.rows)) mine.push_back(&c);
  if (mine.size() != r.cells.size())
    throw Error(fmt::format("{}: {} cells, but the summary has {} of the rank's queries [{}, {}): the summary is not "
                            "of these rows",
                            src, r.cells.size(), mine.size(), r.rows.begin, r.rows.end));
  std::size_t at = 0;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const IndexCell& a = r.cells[i];
    const IndexCell& b = *mine[i];
    if (a.head != b.head || a.qblock != b.qblock || a.kblock != b.kblock || a.area != b.area || a.rows != b.rows)
      throw Error(fmt::format("{}: cell {} (head {}, qblock {}, kblock {}, {} pairs) differs from the summary's (head "
                              "{}, qblock {}, kblock {}, {} pairs): the summary is not of these rows",
                              src, i, a.head, a.qblock, a.kblock, a.area, b.head, b.qblock, b.kblock, b.area));
    Token area = 0;
    for (Range run : a.rows.ranges()) {
      const std::int32_t w = r.width[at];
      const Token n = r.area[at];
      // Each row selects 1 to w of the cell's keys, the widest w: n is in
      // [w + rows - 1, rows x w], and w at most the cell's distinct keys.
      if (w < 1 || w > b.cols.size() || n < w + run.size() - 1 || n > run.size() * w)
        throw Error(fmt::format("{}: run {} (queries [{}, {}) of cell {}) has width {} and {} pairs: each of its rows "
                                "selects between 1 and width keys of the cell's {}, one of them width",
                                src, at, run.begin, run.end, i, w, n, b.cols.size()));
      area += n;
      ++at;
    }
    if (area != a.area)
      throw Error(fmt::format("{}: the runs of cell {} hold {} pairs, the cell {}", src, i, area, a.area));
  }
  p.index_summary = std::move(summary);
  p.index_row_runs = std::move(own_runs);
  p.validate();
  return p;
}

Range Problem::own_index_queries() const {
  if (index_row_runs) return index_row_runs->rows;
  if (index_summary && selection_rows && selection_rows->made() != nullptr) return selection_rows->made()->queries();
  return {};
}

}  // namespace cpsched
