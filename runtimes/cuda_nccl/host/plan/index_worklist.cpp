#include "index_worklist.hpp"

#include <algorithm>
#include <fmt/format.h>
#include <limits>

#include "cpsched/base/error.hpp"
#include "worklist.hpp"

namespace cpsched::gpu {

namespace {

// An index arg's keys: inside `indices`, each -1 or a row of the hull, none twice in a row.
std::span<const std::int32_t> index_rows(const AttnArg& a, std::size_t i, std::span<const std::int32_t> indices) {
  if (a.q.empty() || a.k.empty() || a.q.begin < 0 || a.k.begin < 0)
    throw Error(fmt::format("cuda_nccl: index arg {} has q [{}, {}) and k [{}, {})", i, a.q.begin, a.q.end, a.k.begin,
                            a.k.end));
  const i64 n = a.q.size() * a.index_width;
  if (a.index_width < 0 || a.index_offset < 0 || a.index_offset + n > static_cast<i64>(indices.size()))
    throw Error(fmt::format("cuda_nccl: index arg {} reads indices [{}, {}) of {} (width {})", i, a.index_offset,
                            a.index_offset + n, indices.size(), a.index_width));
  if (a.type != MaskType::full)
    throw Error(fmt::format("cuda_nccl: index arg {} has mask type {} (index args are full)", i, to_string(a.type)));
  const auto keys = indices.subspan(static_cast<std::size_t>(a.index_offset), static_cast<std::size_t>(n));
  std::vector<std::int32_t> row;
  for (i64 r = 0; r < a.q.size(); ++r) {
    row.clear();
    for (i64 j = 0; j < a.index_width; ++j) {
      const std::size_t e = static_cast<std::size_t>(r * a.index_width + j);
      const std::int32_t v = keys[e];
      if (v == -1) continue;
      if (v < a.k.begin || v >= a.k.end)
        throw Error(fmt::format("cuda_nccl: index arg {}: indices[{}] (row {}, entry {}) = {} is outside its k rows [{}, {})",
                                i, a.index_offset + static_cast<i64>(e), a.q.begin + r, j, v, a.k.begin, a.k.end));
      row.push_back(v);
    }
    std::sort(row.begin(), row.end());
    const auto dup = std::adjacent_find(row.begin(), row.end());
    if (dup != row.end())
      throw Error(fmt::format("cuda_nccl: index arg {}: row {} selects key {} twice", i, a.q.begin + r, *dup));
  }
  return keys;
}

// A range arg taken as index rows: its keys must be rows of the pool's run (int32 keys).
Band2 range_band(const AttnArg& a, std::size_t i) {
  if (a.q.empty() || a.k.empty() || a.q.begin < 0 || a.k.begin < 0 ||
      a.k.end > std::numeric_limits<std::int32_t>::max())
    throw Error(fmt::format("cuda_nccl: range arg {} has q [{}, {}) and k [{}, {}) (as index rows: k rows within "
                            "int32)",
                            i, a.q.begin, a.q.end, a.k.begin, a.k.end));
  return band_of(a);
}

}  // namespace

IndexQList index_q_major(std::span<const AttnArg> args, BufferId q_buf, std::span<const std::int32_t> indices,
                         i64 rows_at) {
  struct Piece {
    i64 row;
    std::size_t order;
    IndexQItem item;
  };
  std::vector<Piece> pieces;
  IndexQList out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const AttnArg& a = args[i];
    if (a.q_buf != q_buf) continue;
    if (!a.is_index()) {
      if (rows_at < 0) continue;
      const Band2 b = range_band(a, i);
      const Iv rows = band_rows(b);
      const std::int32_t other = a.k_buf == BufferId::local ? 0 : 1;
      for (i64 q = rows.b; q < rows.e; ++q) {
        const Iv c = row_cols(b, q);
        out.area += c.size();
        for (i64 k0 = c.b; k0 < c.e; k0 += kIndexRowKeys)
          pieces.push_back({q, pieces.size(),
                            IndexQItem{rows_at + k0, static_cast<std::int32_t>(std::min<i64>(kIndexRowKeys, c.e - k0)),
                                       a.group, other, 0}});
      }
      continue;
    }
    const auto keys = index_rows(a, i, indices);
    for (i64 r = 0; r < a.q.size(); ++r) {
      const auto row = keys.subspan(static_cast<std::size_t>(r * a.index_width), static_cast<std::size_t>(a.index_width));
      const i64 valid = std::count_if(row.begin(), row.end(), [](std::int32_t v) { return v >= 0; });
      if (valid == 0) continue;
      out.area += valid;
      pieces.push_back({a.q.begin + r, pieces.size(),
                        IndexQItem{a.index_offset + r * a.index_width, a.index_width, a.group,
                                   a.k_buf == BufferId::local ? 0 : 1, 0}});
    }
  }
  // By row, then arg order.
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& x, const Piece& y) { return x.row != y.row ? x.row < y.row : x.order < y.order; });
  for (const Piece& p : pieces) {
    if (out.rows.empty() || out.rows.back() != p.row) {
      out.rows.push_back(p.row);
      out.begin.push_back(static_cast<std::int32_t>(out.items.size()));
    }
    out.items.push_back(p.item);
  }
  out.begin.push_back(static_cast<std::int32_t>(out.items.size()));
  if (out.items.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    throw Error(fmt::format("cuda_nccl: {} index items in one launch exceed the 32-bit index", out.items.size()));
  return out;
}

IndexKList index_k_major(std::span<const AttnArg> args, BufferId k_buf, std::span<const std::int32_t> indices,
                         bool range_rows) {
  // (tile, arg order, row, cols) of every selected pair (a range arg's row: its cols in the tile), then merged
  // per (tile, arg, row).
  struct Pair {
    i64 tile;
    std::size_t order;
    std::int32_t row;
    std::uint32_t bit;
  };
  i64 area = 0;
  std::vector<Pair> pairs;
  struct ArgInfo {
    std::int32_t group, other_buf;
  };
  std::vector<ArgInfo> info;
  IndexKList out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const AttnArg& a = args[i];
    if (a.k_buf != k_buf || (!a.is_index() && !range_rows)) continue;
    if (!a.is_index()) {
      const Band2 b = range_band(a, i);
      const std::size_t order = info.size();
      info.push_back({a.group, a.q_buf == BufferId::local ? 0 : 1});
      const Iv cols = band_cols(b);
      for (i64 t = cols.b / kIndexColTile; t * kIndexColTile < cols.e; ++t) {
        const i64 t0 = t * kIndexColTile;
        const Band2 sub = clip(b, {b.qa, b.qb}, {t0, t0 + kIndexColTile});
        const Iv rows = band_rows(sub);
        for (i64 q = rows.b; q < rows.e; ++q) {
          const Iv c = row_cols(sub, q);
          if (c.empty()) continue;
          area += c.size();
          pairs.push_back({t, order, static_cast<std::int32_t>(q),
                           ((1u << static_cast<unsigned>(c.size())) - 1u) << static_cast<unsigned>(c.b - t0)});
        }
      }
      continue;
    }
    const auto keys = index_rows(a, i, indices);
    const std::size_t order = info.size();
    info.push_back({a.group, a.q_buf == BufferId::local ? 0 : 1});
    for (std::size_t e = 0; e < keys.size(); ++e) {
      const std::int32_t k = keys[e];
      if (k < 0) continue;
      ++area;
      pairs.push_back({k / kIndexColTile, order,
                       static_cast<std::int32_t>(a.q.begin + static_cast<i64>(e) / a.index_width),
                       1u << static_cast<unsigned>(k % kIndexColTile)});
    }
  }
  out.area = area;
  // Rows ascend inside an arg already; a stable sort by (tile, arg) keeps them so.
  std::stable_sort(pairs.begin(), pairs.end(), [](const Pair& x, const Pair& y) {
    return x.tile != y.tile ? x.tile < y.tile : x.order < y.order;
  });
  for (std::size_t p = 0; p < pairs.size(); ++p) {
    const Pair& x = pairs[p];
    const bool new_tile = out.tiles.empty() || out.tiles.back() != x.tile * kIndexColTile;
    if (new_tile) {
      out.tiles.push_back(x.tile * kIndexColTile);
      out.begin.push_back(static_cast<std::int32_t>(out.items.size()));
    }
    if (new_tile || pairs[p - 1].order != x.order) {
      const ArgInfo& ai = info[x.order];
      out.items.push_back(IndexKItem{static_cast<i64>(out.rows.size()), 0, ai.group, ai.other_buf, 0});
    }
    IndexKItem& it = out.items.back();
    if (it.count > 0 && out.rows.back() == x.row) {
      out.masks.back() |= x.bit;
    } else {
      out.rows.push_back(x.row);
      out.masks.push_back(x.bit);
      ++it.count;
    }
  }
  out.begin.push_back(static_cast<std::int32_t>(out.items.size()));
  if (out.rows.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    throw Error(fmt::format("cuda_nccl: {} index union rows in one launch exceed the 32-bit index", out.rows.size()));
  return out;
}

}  // namespace cpsched::gpu
