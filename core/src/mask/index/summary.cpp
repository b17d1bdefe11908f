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

// Pairs (q, key) with q in `rows`, key in `cols` and key <= q: the sum over
// the rows q of K(q + 1), K(x) = the keys below x, which is constant between
// key ranges and grows by one per token inside one; O(row + key ranges).
__int128 causal_pairs(const RangeSet& rows, const RangeSet& cols) {
  const std::vector<Range>& cr = cols.ranges();
  std::size_t j = 0;   // the first key range not wholly below x
  __int128 below = 0;  // keys in cr[0, j)
  __int128 total = 0;
  for (Range r : rows.ranges()) {
    Token x = r.begin + 1;
    const Token xe = r.end + 1;
    while (x < xe) {
      while (j < cr.size() && cr[j].end <= x) below += cr[j++].size();
      if (j == cr.size() || x <= cr[j].begin) {
        const Token e = j == cr.size() ? xe : std::min(xe, cr[j].begin + 1);
        total += below * (e - x);
        x = e;
      } else {  // K(x) = below + x - cr[j].begin for x in (cr[j].begin, cr[j].end)
        const Token e = std::min(xe, cr[j].end);
        const __int128 n = e - x;
        total += n * (below - cr[j].begin) + (static_cast<__int128>(x) + e - 1) * n / 2;
        x = e;
      }
    }
  }
  return total;
}

std::string wide(__int128 v) {
  if (v > std::numeric_limits<std::int64_t>::max()) return "more than 2^63";
  return std::to_string(static_cast<std::int64_t>(v));
}

}  // namespace

void check_rank_summary(const std::vector<IndexCell>& cells, const std::vector<Range>& blocks, Range rows, int kv_heads,
                        bool causal, const std::string& where) {
  const auto nb = static_cast<std::int64_t>(blocks.size());
  auto inside = [](Range a, Range b) { return a.begin >= b.begin && a.end <= b.end; };
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const IndexCell& c = cells[i];
    const std::string cell = fmt::format("{}: cell {} (head {}, qblock {}, kblock {})", where, i, c.head, c.qblock, c.kblock);
    if (c.head < 0 || c.head >= kv_heads)
      throw Error(fmt::format("{}: head {} is outside the {} selection heads [0, {})", cell, c.head, kv_heads, kv_heads));
    if (c.qblock < 0 || c.qblock >= nb || !inside(blocks[static_cast<std::size_t>(c.qblock)], rows))
      throw Error(fmt::format("{}: qblock {} is not one of the rank's query blocks (its queries are [{}, {})): a "
                              "summary holds its own rows only",
                              cell, c.qblock, rows.begin, rows.end));
    if (c.kblock < 0 || c.kblock >= nb)
      throw Error(fmt::format("{}: kblock {} is outside the {} blocks of S = {}", cell, c.kblock, nb,
                              blocks.empty() ? 0 : blocks.back().end));
    if (i > 0 && !(key_of(cells[i - 1]) < key_of(c)))
      throw Error(fmt::format("{}: it {} cell {} (head {}, qblock {}, kblock {}): cells come once each, sorted by (head, "
                              "qblock, kblock)",
                              cell, key_of(cells[i - 1]) == key_of(c) ? "repeats" : "comes after", i - 1,
                              cells[i - 1].head, cells[i - 1].qblock, cells[i - 1].kblock));
    const Range qb = blocks[static_cast<std::size_t>(c.qblock)], kb = blocks[static_cast<std::size_t>(c.kblock)];
    if (c.rows.empty() || c.cols.empty())
      throw Error(fmt::format("{}: no {} (a cell holds a selection)", cell, c.rows.empty() ? "rows" : "keys"));
    const Range rh{c.rows.ranges().front().begin, c.rows.ranges().back().end};
    const Range ch{c.cols.ranges().front().begin, c.cols.ranges().back().end};
    if (!inside(rh, qb))
      throw Error(fmt::format("{}: rows [{}, {}) reach outside its query block [{}, {})", cell, rh.begin, rh.end,
                              qb.begin, qb.end));
    if (!inside(ch, kb))
      throw Error(fmt::format("{}: keys [{}, {}) reach outside its key block [{}, {})", cell, ch.begin, ch.end,
                              kb.begin, kb.end));
    if (causal && (ch.end > rh.end || ch.begin > rh.begin))
      throw Error(fmt::format("{}: keys [{}, {}) and rows [{}, {}) are not causal ({}): a causal selection has no key "
                              "after its last row and none of its rows before its first key",
                              cell, ch.begin, ch.end, rh.begin, rh.end,
                              ch.end > rh.end ? fmt::format("key {} > row {}", ch.end - 1, rh.end - 1)
                                              : fmt::format("row {} < key {}", rh.begin, ch.begin)));
    const Token nr = c.rows.size(), nc = c.cols.size();
    const __int128 most = causal ? causal_pairs(c.rows, c.cols) : static_cast<__int128>(nr) * nc;
    const Token fewest = std::max(nr, nc);
    if (c.area < fewest || c.area > most)
      throw Error(fmt::format("{}: area {} is outside [{}, {}], the pairs its {} rows and {} keys need and can hold{}",
                              cell, c.area, fewest, wide(most), nr, nc, causal ? " (causal)" : ""));
  }
}

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
