#include "worklist.hpp"

#include <algorithm>
#include <fmt/format.h>
#include <limits>

#include "cpsched/base/error.hpp"

namespace cpsched::gpu {

Band2 band_of(const AttnArg& a) {
  return gpu::band_of(a.q.begin, a.q.end, a.k.begin, a.k.end, static_cast<std::int32_t>(a.type));
}

namespace {

// A piece of one arg in one tile; a stable sort by tile keeps the args' order.
struct Piece {
  i64 tile;
  WorkEntry e;
};

WorkList finish(std::vector<Piece>& pieces) {
  std::stable_sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.tile < b.tile; });
  WorkList w;
  for (const Piece& p : pieces) {
    if (w.tile_start.empty() || w.tile_start.back() != p.tile * kTile) {
      w.tile_start.push_back(p.tile * kTile);
      w.entry_begin.push_back(static_cast<std::int32_t>(w.entries.size()));
    }
    w.entries.push_back(p.e);
  }
  w.entry_begin.push_back(static_cast<std::int32_t>(w.entries.size()));
  if (w.entries.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    throw Error(fmt::format("cuda_nccl: {} attention pieces in one launch exceed the 32-bit index", w.entries.size()));
  return w;
}

void check(const AttnArg& a, std::size_t i) {
  if (a.q.empty() || a.k.empty() || a.q.begin < 0 || a.k.begin < 0)
    throw Error(fmt::format("cuda_nccl: attention arg {} has q [{}, {}) and k [{}, {})", i, a.q.begin, a.q.end,
                            a.k.begin, a.k.end));
}

// An index arg's keys: inside `indices`, each -1 or a row of the hull (the
// kernels read K / V rows and the transposes index cols without bounds checks).
std::span<const std::int32_t> index_rows(const AttnArg& a, std::size_t i, std::span<const std::int32_t> indices) {
  const i64 n = a.q.size() * a.index_width;
  if (a.index_width < 0 || a.index_offset < 0 || a.index_offset + n > static_cast<i64>(indices.size()))
    throw Error(fmt::format("cuda_nccl: index arg {} reads indices [{}, {}) of {} (width {})", i, a.index_offset,
                            a.index_offset + n, indices.size(), a.index_width));
  if (a.type != MaskType::full)
    throw Error(fmt::format("cuda_nccl: index arg {} has mask type {} (index args are full)", i, to_string(a.type)));
  const auto keys = indices.subspan(static_cast<std::size_t>(a.index_offset), static_cast<std::size_t>(n));
  for (std::size_t e = 0; e < keys.size(); ++e) {
    const std::int32_t v = keys[e];
    if (v != -1 && (v < a.k.begin || v >= a.k.end))
      throw Error(fmt::format("cuda_nccl: index arg {}: indices[{}] (row {}, entry {}) = {} is outside its k rows [{}, {})",
                              i, a.index_offset + static_cast<i64>(e), a.q.begin + static_cast<i64>(e) / a.index_width,
                              static_cast<i64>(e) % a.index_width, v, a.k.begin, a.k.end));
  }
  return keys;
}

WorkEntry entry(const Band2& b, Iv major, Iv loop, const AttnArg& a, BufferId other, i64 index_base) {
  return WorkEntry{b,       major.b, major.e, loop.b, loop.e, a.group, other == BufferId::local ? 0 : 1,
                   index_base, a.index_width, 0};
}

}  // namespace

WorkList q_major(std::span<const AttnArg> args, BufferId q_buf, std::span<const std::int32_t> indices) {
  std::vector<Piece> pieces;
  i64 area = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const AttnArg& a = args[i];
    if (a.q_buf != q_buf) continue;
    check(a, i);
    const Band2 b = band_of(a);
    if (a.is_index()) {
      const auto keys = index_rows(a, i, indices);
      const i64 base = a.index_offset - a.q.begin * a.index_width;
      for (i64 t = a.q.begin / kTile; t * kTile < a.q.end; ++t) {
        const Iv rows{std::max(a.q.begin, t * kTile), std::min(a.q.end, (t + 1) * kTile)};
        const auto first = static_cast<std::size_t>((rows.b - a.q.begin) * a.index_width);
        const auto last = static_cast<std::size_t>((rows.e - a.q.begin) * a.index_width);
        const i64 valid = std::count_if(keys.begin() + static_cast<std::ptrdiff_t>(first),
                                        keys.begin() + static_cast<std::ptrdiff_t>(last),
                                        [](std::int32_t v) { return v >= 0; });
        if (valid == 0) continue;
        area += valid;
        pieces.push_back({t, entry(b, rows, {a.k.begin, a.k.end}, a, a.k_buf, base)});
      }
      continue;
    }
    for (i64 t = a.q.begin / kTile; t * kTile < a.q.end; ++t) {
      const Band2 sub = clip(b, {t * kTile, (t + 1) * kTile}, {b.ka, b.kb});
      const Iv rows = band_rows(sub);
      if (rows.empty()) continue;
      const Iv cols = band_cols(sub);
      area += band_area(sub);
      pieces.push_back({t, entry(b, rows, cols, a, a.k_buf, 0)});
    }
  }
  WorkList w = finish(pieces);
  w.area = area;
  return w;
}

WorkList k_major(std::span<const AttnArg> args, BufferId k_buf, std::span<const std::int32_t> indices) {
  std::vector<Piece> pieces;
  std::vector<i64> t_ptr;
  std::vector<std::int32_t> t_rows;
  i64 area = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const AttnArg& a = args[i];
    if (a.k_buf != k_buf) continue;
    check(a, i);
    const Band2 b = band_of(a);
    if (a.is_index()) {
      // The transpose: per hull col, the q rows that select it (counting
      // sort by col; rows come in ascending order, so each list is sorted).
      const auto keys = index_rows(a, i, indices);
      const i64 ncols = a.k.size(), first = static_cast<i64>(t_ptr.size());
      t_ptr.resize(t_ptr.size() + static_cast<std::size_t>(ncols) + 1, 0);
      i64* ptr = t_ptr.data() + first;
      for (std::int32_t v : keys)
        if (v >= 0) ++ptr[v - a.k.begin + 1];
      const auto row_base = static_cast<i64>(t_rows.size());
      ptr[0] = row_base;
      for (i64 c = 0; c < ncols; ++c) ptr[c + 1] += ptr[c];
      t_rows.resize(static_cast<std::size_t>(ptr[ncols]));
      std::vector<i64> fill(ptr, ptr + ncols);
      for (std::size_t e = 0; e < keys.size(); ++e)
        if (keys[e] >= 0)
          t_rows[static_cast<std::size_t>(fill[static_cast<std::size_t>(keys[e] - a.k.begin)]++)] =
              static_cast<std::int32_t>(a.q.begin + static_cast<i64>(e) / a.index_width);
      for (i64 t = a.k.begin / kTile; t * kTile < a.k.end; ++t) {
        // The tile's cols that some row reads (empty cols at either end cut off).
        i64 cb = std::max(a.k.begin, t * kTile), ce = std::min(a.k.end, (t + 1) * kTile);
        while (cb < ce && ptr[cb - a.k.begin] == ptr[cb - a.k.begin + 1]) ++cb;
        while (ce > cb && ptr[ce - 1 - a.k.begin] == ptr[ce - a.k.begin]) --ce;
        if (cb == ce) continue;
        area += ptr[ce - a.k.begin] - ptr[cb - a.k.begin];
        pieces.push_back({t, entry(b, {cb, ce}, {a.q.begin, a.q.end}, a, a.q_buf, first - a.k.begin)});
      }
      continue;
    }
    for (i64 t = a.k.begin / kTile; t * kTile < a.k.end; ++t) {
      const Band2 sub = clip(b, {b.qa, b.qb}, {t * kTile, (t + 1) * kTile});
      const Iv rows = band_rows(sub);
      if (rows.empty()) continue;
      const Iv cols = band_cols(sub);
      area += band_area(sub);
      pieces.push_back({t, entry(b, cols, rows, a, a.q_buf, 0)});
    }
  }
  WorkList w = finish(pieces);
  w.area = area;
  w.t_ptr = std::move(t_ptr);
  w.t_rows = std::move(t_rows);
  return w;
}

Grid grid_of(const WorkList& w, int head_slots) { return Grid{w.num_tiles(), w.empty() ? 0 : head_slots, kTile}; }

}  // namespace cpsched::gpu
