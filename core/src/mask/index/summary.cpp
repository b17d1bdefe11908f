// Per-rank summaries of a token top-k mask (summary.hpp): counting a rank's
// rows, merging the ranks' summaries and coarsening them to other blocks.
#include "cpsched/mask/index/summary.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <tuple>

#include "cpsched/base/error.hpp"
#include "mask/index/internal.hpp"

namespace cpsched {

using namespace index_detail;

namespace {

// Index of the block that begins at token t, or -1.
std::int64_t block_starting_at(const std::vector<Range>& blocks, Token t) {
  const auto it = std::lower_bound(blocks.begin(), blocks.end(), t, [](Range r, Token x) { return r.begin < x; });
  return it != blocks.end() && it->begin == t ? it - blocks.begin() : -1;
}

// The block holding token t (blocks tile [0, S), t in it).
std::int64_t block_of(const std::vector<Range>& blocks, Token t) {
  return std::upper_bound(blocks.begin(), blocks.end(), t, [](Token x, Range r) { return x < r.begin; }) -
         blocks.begin() - 1;
}

auto key_of(const IndexCell& c) { return std::tie(c.head, c.qblock, c.kblock); }

// Sorts by (head, qblock, kblock) and folds cells with equal keys into one.
std::vector<IndexCell> fold(std::vector<IndexCell> cells) {
  std::stable_sort(cells.begin(), cells.end(), [](const IndexCell& a, const IndexCell& b) { return key_of(a) < key_of(b); });
  std::vector<IndexCell> out;
  out.reserve(cells.size());
  RangeSet::Builder rows, cols;
  for (std::size_t i = 0; i < cells.size();) {
    std::size_t j = i + 1;
    while (j < cells.size() && key_of(cells[j]) == key_of(cells[i])) ++j;
    if (j == i + 1) {
      out.push_back(std::move(cells[i]));
    } else {
      IndexCell c;
      c.head = cells[i].head;
      c.qblock = cells[i].qblock;
      c.kblock = cells[i].kblock;
      for (std::size_t x = i; x < j; ++x) {
        c.area += cells[x].area;
        rows.add(cells[x].rows);
        cols.add(cells[x].cols);
      }
      c.rows = rows.build();
      c.cols = cols.build();
      out.push_back(std::move(c));
    }
    i = j;
  }
  return out;
}

}  // namespace

std::vector<IndexCell> summarize_topk_rows(const TopkRows& rows, const std::vector<Range>& blocks,
                                           IndexCountOptions options) {
  const IndexArray& ix = rows.indices;
  const std::string src = source_of(ix, "indices");
  const Token S = rows.seqlen;
  if (S < 1 || S > std::numeric_limits<std::int32_t>::max())
    throw Error(fmt::format("summarize_topk_rows: S = {} must be in [1, 2147483647]", S));
  if (ix.shape.size() != 3)
    throw Error(fmt::format("{}: shape {} has {} dimensions (expected a rank's rows [rows, H_kv, k])", src,
                            shape_string(ix.shape), ix.shape.size()));
  check_array_data(ix, "indices");
  if (ix.shape[1] < 1) throw Error(fmt::format("{}: shape {} has no KV heads (H_kv = 0)", src, shape_string(ix.shape)));
  const Range r = rows.rows();
  if (r.begin < 0 || r.end > S)
    throw Error(fmt::format("{}: the rows [{}, {}) (first_row {} + {} rows) are outside the sequence [0, {})", src,
                            r.begin, r.end, rows.first_row, ix.shape[0], S));
  check_blocks(blocks, S);
  if (r.empty()) return {};
  const std::int64_t qb0 = block_starting_at(blocks, r.begin);
  const std::int64_t qb1 = r.end == S ? static_cast<std::int64_t>(blocks.size()) : block_starting_at(blocks, r.end);
  auto cut = [&](Token t) {
    const Range b = blocks[static_cast<std::size_t>(block_of(blocks, t))];
    return Error(fmt::format("{}: the rows [{}, {}) cut block [{}, {}) at token {}: a rank's rows must be whole blocks",
                             src, r.begin, r.end, b.begin, b.end, t));
  };
  if (qb0 < 0) throw cut(r.begin);
  if (qb1 < 0) throw cut(r.end);
  IndexMask m;
  m.kind = IndexMaskKind::topk;
  m.seqlen = S;
  m.kv_heads = static_cast<int>(ix.shape[1]);
  m.causal = rows.causal;
  m.indices = ix;  // [rows, H_kv, k] from query first_row on: count_cells reads it so
  return count_cells(m, r.begin, qb0, qb1, blocks, options);
}

std::vector<IndexCell> merge_index_cells(const std::vector<std::vector<IndexCell>>& parts) {
  std::size_t n = 0;
  for (const auto& p : parts) n += p.size();
  std::vector<IndexCell> all;
  all.reserve(n);
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  return fold(std::move(all));
}

std::vector<IndexCell> coarsen_index_cells(const std::vector<IndexCell>& cells, const std::vector<Range>& fine,
                                           const std::vector<Range>& coarse) {
  if (fine.empty()) throw Error("coarsen_index_cells: no fine blocks");
  const Token S = fine.back().end;
  check_blocks(fine, S);
  check_blocks(coarse, S);
  // fine block -> coarse block
  std::vector<std::int32_t> up(fine.size());
  for (std::size_t c = 0; c < coarse.size(); ++c) {
    const std::int64_t f = block_starting_at(fine, coarse[c].begin);
    if (f < 0)
      throw Error(fmt::format("coarsen_index_cells: coarse block {} = [{}, {}) starts inside fine block [{}, {})", c,
                              coarse[c].begin, coarse[c].end, fine[static_cast<std::size_t>(block_of(fine, coarse[c].begin))].begin,
                              fine[static_cast<std::size_t>(block_of(fine, coarse[c].begin))].end));
    for (std::size_t x = static_cast<std::size_t>(f); x < fine.size() && fine[x].begin < coarse[c].end; ++x)
      up[x] = static_cast<std::int32_t>(c);
  }
  std::vector<IndexCell> out;
  out.reserve(cells.size());
  for (const IndexCell& c : cells) {
    if (c.qblock < 0 || c.kblock < 0 || static_cast<std::size_t>(c.qblock) >= fine.size() ||
        static_cast<std::size_t>(c.kblock) >= fine.size())
      throw Error(fmt::format("coarsen_index_cells: cell ({}, {}) is outside the {} fine blocks", c.qblock, c.kblock,
                              fine.size()));
    IndexCell x = c;
    x.qblock = up[static_cast<std::size_t>(c.qblock)];
    x.kblock = up[static_cast<std::size_t>(c.kblock)];
    out.push_back(std::move(x));
  }
  return fold(std::move(out));
}

}  // namespace cpsched
