// count_index_cells (index_cells.hpp): one multi-threaded pass over a topk
// mask's indices that validates every entry and counts, per (head, query
// block, key block), the selected pairs, the query rows with any selection
// and the distinct selected keys.
//
// The query rows are split over threads in contiguous runs of about equal
// size, cut anywhere (a rank's rows are often one query block): each thread
// counts the parts of the blocks it holds, and the parts of a block cut
// between threads are then folded (areas add, rows and keys unite), so the
// cells do not depend on the thread count. Per row,
// one loop checks and counts each entry (range, causality, duplicates:
// strictly increasing rows have none; rows in any order use per-thread row
// stamps, see scan_topk_row). Per query block: a byte per key and head
// marks the selected keys, which give the cols of each key block (a byte
// store per key; a bitmap's read-modify-write of one word per key chained
// through memory, was slower on sorted rows:
// docs/bounds.md#measurements-behind-code-constants); rows grow as runs (a
// row touches a cell once). Extra memory is O(S) bytes per thread plus the
// cells themselves, never O(indices).
#include "cpsched/mask/index/cells.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>

#include "cpsched/base/error.hpp"
#include "mask/index/internal.hpp"

namespace cpsched {

using namespace index_detail;

namespace {

// Next position in [p, end) whose byte is nonzero (want) or zero (!want);
// `end` when none. Eight bytes at a time.
Token next_byte(const std::uint8_t* m, Token p, Token end, bool want) {
  constexpr std::uint64_t kOnes = 0x0101010101010101;
  for (; p < end && (p & 7) != 0; ++p)
    if ((m[p] != 0) == want) return p;
  for (; p + 8 <= end; p += 8) {
    std::uint64_t x;
    std::memcpy(&x, m + p, 8);
    if (!want) x ^= kOnes;  // bytes are 0 or 1
    if (x != 0) return p + std::countr_zero(x) / 8;
  }
  for (; p < end; ++p)
    if ((m[p] != 0) == want) return p;
  return end;
}

struct Counter {
  const IndexMask& m;
  const std::vector<Range>& blocks;
  int cell_heads;  // kv_heads per head, 1 merged
  std::int64_t nb;
  Token row0;      // query token of the array's first row (0: the whole mask)

  // Per thread.
  struct State {
    Bits seen;                          // this row's keys (duplicates), sorted rows
    RowStamps stamps;                   // the same, rows in any order
    std::vector<std::uint8_t> keys;     // cell_heads x S bytes, 1: the key is selected in this query block
    std::vector<Token> area;            // cell_heads x nb
    std::vector<Token> last;            // last row that touched the cell
    std::vector<RangeSet> rows;
    std::vector<std::int32_t> touched;  // cells touched in this query block
  };

  // Keys of row i must be below this.
  std::int64_t causal_end(std::int64_t i) const { return m.causal ? std::min<std::int64_t>(i + 1, m.seqlen) : m.seqlen; }

  // A row in the usual layout, its valid keys first and strictly ascending,
  // then -1s (DSA indexers' sorted output, and the dsa generator's), counted
  // without a check per entry: the entries other than -1 are counted, and
  // the row has that layout when its first c entries ascend strictly from
  // >= 0 to < `end` (then those are all of its valid entries, and the row has
  // no error). Each key block's part is found by a search. Returns false,
  // having changed nothing, for a row of another layout (or with an error):
  // the scan counts it.
  template <class Lut, class Touch>
  bool prefix_row(const std::int32_t* row, std::int64_t k, std::int64_t end, const Lut& lut, Token* area,
                  std::uint8_t* keys, Touch& touch) const {
    if (k > std::numeric_limits<std::int32_t>::max()) return false;
    std::uint32_t n = 0;  // (32 bits: twice the lanes of a 64-bit count)
    for (std::int64_t j = 0; j < k; ++j) n += row[j] != -1 ? 1 : 0;
    const std::int64_t c = n;
    if (c == 0) return true;
    int descents = row[0] < 0 || row[c - 1] >= end;
    for (std::int64_t j = 1; j < c; ++j) descents |= row[j] <= row[j - 1];
    if (descents != 0) return false;
    for (const std::int32_t *e = row, *stop = row + c; e < stop;) {
      const std::int64_t b = lut(*e);
      const Token b_end = blocks[static_cast<std::size_t>(b)].end;
      const std::int32_t* part = stop[-1] < b_end ? stop : std::lower_bound(e, stop, static_cast<std::int32_t>(b_end));
      touch(b);
      area[b] += part - e;
      for (; e < part; ++e) keys[*e] = 1;
    }
    return true;
  }

  // The cells of the rows `q` of query block qb (all of it, or the part a thread holds).
  template <class Lut>
  void count_block(State& st, const Lut& lut, std::int64_t qb, Range q, FirstError& fe, int t,
                   std::vector<IndexCell>& out) const {
    const std::int64_t S = m.seqlen, H = m.kv_heads, k = m.indices.shape[2];
    bool sorted_rows = true;  // the last row's layout
    for (std::int64_t i = q.begin; i < q.end; ++i) {
      if (fe.before((i - row0) * H * k)) return;
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int32_t* row = m.indices.data + ((i - row0) * H + h) * k;
        const std::int64_t ch = cell_heads == 1 ? 0 : h;
        Token* area = st.area.data() + ch * nb;
        Token* last = st.last.data() + ch * nb;
        std::uint8_t* keys = st.keys.data() + ch * m.seqlen;
        // Sorted rows: consecutive keys mostly share a key block, so count
        // runs in registers and write once per run (a read-modify-write chain
        // on one counter per entry is slow). Rows in any order: write per
        // entry (the block changes at random, and a branch per change would
        // mispredict). The previous row's layout picks; both count the same.
        std::int64_t run_b = -1;
        Token run_n = 0;
        // First touch of cell b by this row (a cell not yet touched in this
        // query block has area 0 and last < the block's first row).
        auto touch = [&](std::int64_t b) {
          if (last[b] == i) return;
          const auto c = static_cast<std::size_t>(ch * nb + b);
          if (area[b] == 0) {
            st.touched.push_back(static_cast<std::int32_t>(c));
            st.rows[c] = RangeSet();
          }
          st.rows[c].add({i, i + 1});  // O(1): appends or extends the last run
          last[b] = i;
        };
        auto flush_run = [&] {
          if (run_b < 0) return;
          touch(run_b);
          area[run_b] += run_n;
        };
        std::int64_t bad;
        if (sorted_rows && prefix_row(row, k, causal_end(i), lut, area, keys, touch)) continue;
        if (sorted_rows) {
          bad = scan_topk_row<false>(row, k, i, S, m.causal, st.seen, [&](std::int64_t v) {
            const std::int64_t b = lut(v);
            if (b != run_b) {
              flush_run();
              run_b = b;
              run_n = 0;
            }
            ++run_n;
            keys[v] = 1;
          }, sorted_rows);
          flush_run();
        } else {
          st.stamps.next_row();
          bad = scan_topk_row<true>(row, k, i, S, m.causal, st.stamps, [&](std::int64_t v) {
            const std::int64_t b = lut(v);
            touch(b);
            ++area[b];
            keys[v] = 1;
          }, sorted_rows);
        }
        if (bad >= 0) {
          fe.report(t, ((i - row0) * H + h) * k + bad, topk_entry_error(m, i, h, bad, row0));
          return;
        }
      }
    }
    // The block's cells, sorted by (head, key block).
    std::sort(st.touched.begin(), st.touched.end());
    for (std::int32_t c : st.touched) {
      const std::int64_t ch = c / nb, b = c % nb;
      IndexCell cell;
      cell.qblock = static_cast<std::int32_t>(qb);
      cell.kblock = static_cast<std::int32_t>(b);
      cell.head = static_cast<int>(ch);
      cell.area = st.area[static_cast<std::size_t>(c)];
      cell.rows = std::move(st.rows[static_cast<std::size_t>(c)]);
      const Range kr = blocks[static_cast<std::size_t>(b)];
      const std::uint8_t* keys = st.keys.data() + ch * m.seqlen;
      for (Token p = next_byte(keys, kr.begin, kr.end, true); p < kr.end;) {
        const Token e = next_byte(keys, p, kr.end, false);
        cell.cols.add({p, e});
        p = next_byte(keys, e, kr.end, true);
      }
      out.push_back(std::move(cell));
    }
    // Reset what this block touched.
    for (std::int32_t c : st.touched) {
      const std::int64_t ch = c / nb, b = c % nb;
      const Range kr = blocks[static_cast<std::size_t>(b)];
      std::fill(st.keys.begin() + ch * m.seqlen + kr.begin, st.keys.begin() + ch * m.seqlen + kr.end, 0);
      st.area[static_cast<std::size_t>(c)] = 0;
    }
    st.touched.clear();
  }
};

// Token -> block lookups. Coarse: one entry per 64 tokens (S / 32 bytes, in
// L1 at S = 128k) plus one compare, valid when every block has >= 64 tokens
// (a 64-token bucket then holds at most one block start). Full: one entry
// per token (2 or 4 bytes each).
struct CoarseLut {
  const std::uint16_t* bucket;  // block of token 64 w
  const Token* end;             // blocks[b].end
  std::int64_t operator()(std::int64_t v) const {
    const std::int64_t b = bucket[v >> 6];
    return b + (v >= end[b]);
  }
};
template <class T>
struct FullLut {
  const T* block;
  std::int64_t operator()(std::int64_t v) const { return block[v]; }
};

// The lookup that suits the blocks (see above), built once per pass.
struct BlockLuts {
  bool coarse = false;
  std::vector<std::uint16_t> lut16;
  std::vector<std::int32_t> lut32;
  std::vector<Token> ends;

  BlockLuts(const std::vector<Range>& blocks, Token S) {
    const auto nb = static_cast<std::int64_t>(blocks.size());
    Token min_block = S;
    for (Range r : blocks) min_block = std::min(min_block, r.size());
    coarse = nb <= 65535 && min_block >= 64;
    if (coarse) {
      lut16.resize(static_cast<std::size_t>((S + 63) / 64));
      for (std::size_t w = 0, b = 0; w < lut16.size(); ++w) {
        while (blocks[b].end <= static_cast<Token>(w) * 64) ++b;
        lut16[w] = static_cast<std::uint16_t>(b);
      }
      for (Range r : blocks) ends.push_back(r.end);
    } else {
      auto fill = [&](auto& lut) {
        lut.resize(static_cast<std::size_t>(S));
        for (std::int64_t b = 0; b < nb; ++b)
          std::fill(lut.begin() + blocks[static_cast<std::size_t>(b)].begin,
                    lut.begin() + blocks[static_cast<std::size_t>(b)].end,
                    static_cast<typename std::decay_t<decltype(lut)>::value_type>(b));
      };
      if (nb <= 65536) fill(lut16); else fill(lut32);
    }
  }
  template <class F>
  void visit(F&& f) const {
    if (coarse) f(CoarseLut{lut16.data(), ends.data()});
    else if (lut32.empty()) f(FullLut<std::uint16_t>{lut16.data()});
    else f(FullLut<std::int32_t>{lut32.data()});
  }
};

// The cells of one query block counted in parts (rows cut between threads,
// each part sorted by (head, kblock)) as one list sorted so: cells of the
// same (head, kblock) add their areas and unite their rows and keys.
std::vector<IndexCell> fold_parts(const std::vector<std::vector<IndexCell>*>& parts) {
  std::vector<IndexCell*> all;
  for (std::vector<IndexCell>* p : parts)
    for (IndexCell& c : *p) all.push_back(&c);
  // Stable: equal keys keep the parts' order, so rows come in ascending order.
  std::stable_sort(all.begin(), all.end(), [](const IndexCell* a, const IndexCell* b) {
    return std::tie(a->head, a->kblock) < std::tie(b->head, b->kblock);
  });
  std::vector<IndexCell> out;
  RangeSet::Builder rows, cols;
  for (std::size_t i = 0; i < all.size();) {
    std::size_t j = i + 1;
    while (j < all.size() && all[j]->head == all[i]->head && all[j]->kblock == all[i]->kblock) ++j;
    IndexCell c = std::move(*all[i]);
    if (j > i + 1) {
      rows.add(c.rows);
      cols.add(c.cols);
      for (std::size_t x = i + 1; x < j; ++x) {
        c.area += all[x]->area;
        rows.add(all[x]->rows);
        cols.add(all[x]->cols);
      }
      c.rows = rows.build();
      c.cols = cols.build();
    }
    out.push_back(std::move(c));
    i = j;
  }
  return out;
}

}  // namespace

namespace index_detail {

// The cells of the query blocks [qb0, qb1), whose rows the mask's array holds
// from query token row0 on (checked by the callers).
std::vector<IndexCell> count_cells(const IndexMask& mask, Token row0, std::int64_t qb0, std::int64_t qb1,
                                   const std::vector<Range>& blocks, IndexCountOptions options) {
  const Token S = mask.seqlen;
  const std::int64_t nb = static_cast<std::int64_t>(blocks.size());
  Counter counter{mask, blocks, options.per_head ? mask.kv_heads : 1, nb, row0};

  const BlockLuts luts(blocks, S);
  const Token r0 = qb0 < qb1 ? blocks[static_cast<std::size_t>(qb0)].begin : 0;
  const Token r1 = qb0 < qb1 ? blocks[static_cast<std::size_t>(qb1 - 1)].end : 0;
  // Contiguous runs of about equal rows: as many as asked (one row at
  // least each), else as the hardware has, of at least kMinEntries entries
  // each (below that a thread costs more than it counts).
  constexpr std::int64_t kMinEntries = 1 << 16;
  const std::int64_t per_row = std::max<std::int64_t>(1, mask.kv_heads * mask.indices.shape[2]);
  const std::int64_t most = options.threads > 0 ? r1 - r0 : (r1 - r0) * per_row / kMinEntries;
  const int T = static_cast<int>(std::clamp<std::int64_t>(most, 1, resolve_threads(options.threads)));
  // Thread t's rows [cut[t], cut[t + 1]); its parts of blocks, in order: (block, cells).
  std::vector<Token> cut(static_cast<std::size_t>(T) + 1);
  for (int t = 0; t <= T; ++t) cut[static_cast<std::size_t>(t)] = r0 + (r1 - r0) * t / T;
  using Part = std::pair<std::int64_t, std::vector<IndexCell>>;
  std::vector<std::vector<Part>> parts(static_cast<std::size_t>(T));
  FirstError fe(T);
  run_threads(T, [&](int t) {
    const Range mine{cut[static_cast<std::size_t>(t)], cut[static_cast<std::size_t>(t) + 1]};
    if (mine.empty()) return;
    Counter::State st;
    st.seen.resize(S);
    st.stamps.resize(S);
    const std::size_t cells = static_cast<std::size_t>(counter.cell_heads * nb);
    st.keys.assign(static_cast<std::size_t>(counter.cell_heads * S), 0);
    st.area.assign(cells, 0);
    st.last.assign(cells, -2);
    st.rows.resize(cells);
    const auto first = std::upper_bound(blocks.begin() + qb0, blocks.begin() + qb1, mine.begin,
                                        [](Token x, Range r) { return x < r.begin; }) - 1;
    for (std::int64_t qb = first - blocks.begin(); qb < qb1 && blocks[static_cast<std::size_t>(qb)].begin < mine.end;
         ++qb) {
      Part& part = parts[static_cast<std::size_t>(t)].emplace_back(qb, std::vector<IndexCell>{});
      const Range q = blocks[static_cast<std::size_t>(qb)].intersect(mine);
      luts.visit([&](const auto& lut) { counter.count_block(st, lut, qb, q, fe, t, part.second); });
    }
  });
  fe.rethrow();

  // Per block, its parts in thread order (each sorted by (head, kblock)),
  // folded into one list where a block was cut between threads.
  std::vector<std::vector<IndexCell>> per_block(static_cast<std::size_t>(nb));
  std::vector<std::vector<std::vector<IndexCell>*>> cut_parts(static_cast<std::size_t>(nb));
  for (auto& list : parts)
    for (Part& p : list) cut_parts[static_cast<std::size_t>(p.first)].push_back(&p.second);
  for (std::int64_t qb = qb0; qb < qb1; ++qb) {
    auto& ps = cut_parts[static_cast<std::size_t>(qb)];
    if (ps.size() == 1) per_block[static_cast<std::size_t>(qb)] = std::move(*ps.front());
    else if (ps.size() > 1) per_block[static_cast<std::size_t>(qb)] = fold_parts(ps);
  }

  // (head, qblock, kblock): each block's list is sorted by (head, kblock).
  std::vector<IndexCell> out;
  std::size_t total = 0;
  for (const auto& v : per_block) total += v.size();
  out.reserve(total);
  std::vector<std::size_t> cursor(static_cast<std::size_t>(nb), 0);
  for (int h = 0; h < counter.cell_heads; ++h)
    for (std::int64_t qb = qb0; qb < qb1; ++qb) {
      auto& v = per_block[static_cast<std::size_t>(qb)];
      std::size_t& c = cursor[static_cast<std::size_t>(qb)];
      while (c < v.size() && v[c].head == h) out.push_back(std::move(v[c++]));
    }
  return out;
}

void check_blocks(const std::vector<Range>& blocks, Token S) {
  if (blocks.empty()) throw Error("count_index_cells: no blocks (they must tile [0, S))");
  Token at = 0;
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    if (blocks[b].begin != at || blocks[b].end <= blocks[b].begin)
      throw Error(fmt::format("count_index_cells: block {} = [{}, {}) does not continue the tiling of [0, {}) at {}", b,
                              blocks[b].begin, blocks[b].end, S, at));
    at = blocks[b].end;
  }
  if (at != S) throw Error(fmt::format("count_index_cells: the blocks end at {}, not at S = {}", at, S));
  if (blocks.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    throw Error("count_index_cells: too many blocks");
}


}  // namespace index_detail

std::vector<IndexCell> count_index_cells(const IndexMask& mask, const std::vector<Range>& blocks,
                                         IndexCountOptions options) {
  if (mask.kind != IndexMaskKind::topk)
    throw Error(fmt::format("count_index_cells: a {} mask is a range mask per head; use block_selection_masks",
                            to_string(mask.kind)));
  check_structure(mask);
  check_blocks(blocks, mask.seqlen);
  return count_cells(mask, 0, 0, static_cast<std::int64_t>(blocks.size()), blocks, options);
}

IndexPlanCounts count_index_plan(const IndexMask& mask, const std::vector<Range>& blocks, IndexCountOptions options) {
  if (mask.kind != IndexMaskKind::topk)
    throw Error(fmt::format("count_index_plan: a {} mask is a range mask per head", to_string(mask.kind)));
  check_structure(mask);
  const Token S = mask.seqlen;
  check_blocks(blocks, S);
  const auto nb = static_cast<std::int64_t>(blocks.size());
  const std::int64_t H = mask.kv_heads, k = mask.indices.shape[2];
  const std::int64_t cell_heads = options.per_head ? H : 1;
  const BlockLuts luts(blocks, S);
  const int T = static_cast<int>(std::min<std::int64_t>(resolve_threads(options.threads), nb));
  std::vector<IndexPlanCounts> part(static_cast<std::size_t>(T));
  run_threads(T, [&](int t) {
    const auto cells = static_cast<std::size_t>(cell_heads * nb);
    // Per cell of the current query block: rows, widest row, pairs; per row: its count and last row.
    std::vector<std::int32_t> rows(cells, 0), width(cells, 0), row_n(cells, 0);
    std::vector<std::int64_t> pairs(cells, 0), last(cells, -1);
    std::vector<std::int32_t> row_touched, block_touched;
    IndexPlanCounts& c = part[static_cast<std::size_t>(t)];
    luts.visit([&](const auto& lut) {
      for (std::int64_t qb = nb * t / T; qb < nb * (t + 1) / T; ++qb) {
        const Range q = blocks[static_cast<std::size_t>(qb)];
        for (std::int64_t i = q.begin; i < q.end; ++i)
          for (std::int64_t h = 0; h < H; ++h) {
            const std::int32_t* row = mask.indices.data + (i * H + h) * k;
            const std::int64_t base = (options.per_head ? h : 0) * nb;
            // A merged head's row is (i, every head): one row per query.
            const std::int64_t row_id = options.per_head ? i * H + h : i;
            // Runs of entries in one cell (sorted rows are mostly runs) are counted in registers.
            std::int64_t run_cell = -1;
            std::int32_t run_n = 0;
            auto flush = [&] {
              if (run_cell < 0) return;
              const auto cell = static_cast<std::size_t>(run_cell);
              if (last[cell] != row_id) {
                last[cell] = row_id;
                row_n[cell] = 0;
                row_touched.push_back(static_cast<std::int32_t>(cell));
                if (rows[cell] == 0 && pairs[cell] == 0) block_touched.push_back(static_cast<std::int32_t>(cell));
              }
              row_n[cell] += run_n;
            };
            for (std::int64_t j = 0; j < k; ++j) {
              const std::int64_t v = row[j];
              if (v < 0 || v >= S) continue;
              const std::int64_t cell = base + lut(v);
              if (cell != run_cell) {
                flush();
                run_cell = cell;
                run_n = 0;
              }
              ++run_n;
            }
            flush();
            // Rows end with the last head when heads are merged.
            if (options.per_head || h == H - 1) {
              for (std::int32_t x : row_touched) {
                ++rows[static_cast<std::size_t>(x)];
                width[static_cast<std::size_t>(x)] = std::max(width[static_cast<std::size_t>(x)], row_n[static_cast<std::size_t>(x)]);
                pairs[static_cast<std::size_t>(x)] += row_n[static_cast<std::size_t>(x)];
              }
              row_touched.clear();
            }
          }
        for (std::int32_t x : block_touched) {
          const auto xi = static_cast<std::size_t>(x);
          const Range kr = blocks[static_cast<std::size_t>(x % nb)];
          ++c.cells;
          c.pairs += pairs[xi];
          c.pool += std::int64_t{rows[xi]} * width[xi];
          c.row_ranges += std::min<std::int64_t>(rows[xi], (q.size() + 1) / 2);
          c.col_ranges += std::min<std::int64_t>(pairs[xi], (kr.size() + 1) / 2);
          rows[xi] = width[xi] = 0;
          pairs[xi] = 0;
          last[xi] = -1;
        }
        block_touched.clear();
      }
    });
  });
  IndexPlanCounts total;
  for (const IndexPlanCounts& c : part) {
    total.pairs += c.pairs;
    total.cells += c.cells;
    total.pool += c.pool;
    total.row_ranges += c.row_ranges;
    total.col_ranges += c.col_ranges;
  }
  return total;
}

}  // namespace cpsched
