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

WorkEntry entry(const Band2& b, Iv major, Iv loop, const AttnArg& a, BufferId other) {
  return WorkEntry{b, major.b, major.e, loop.b, loop.e, a.group, other == BufferId::local ? 0 : 1};
}

}  // namespace

WorkList q_major(std::span<const AttnArg> args, BufferId q_buf) {
  std::vector<Piece> pieces;
  i64 area = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const AttnArg& a = args[i];
    if (a.q_buf != q_buf || a.is_index()) continue;
    check(a, i);
    const Band2 b = band_of(a);
    for (i64 t = a.q.begin / kTile; t * kTile < a.q.end; ++t) {
      const Band2 sub = clip(b, {t * kTile, (t + 1) * kTile}, {b.ka, b.kb});
      const Iv rows = band_rows(sub);
      if (rows.empty()) continue;
      const Iv cols = band_cols(sub);
      area += band_area(sub);
      pieces.push_back({t, entry(b, rows, cols, a, a.k_buf)});
    }
  }
  WorkList w = finish(pieces);
  w.area = area;
  return w;
}

WorkList k_major(std::span<const AttnArg> args, BufferId k_buf) {
  std::vector<Piece> pieces;
  i64 area = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const AttnArg& a = args[i];
    if (a.k_buf != k_buf || a.is_index()) continue;
    check(a, i);
    const Band2 b = band_of(a);
    for (i64 t = a.k.begin / kTile; t * kTile < a.k.end; ++t) {
      const Band2 sub = clip(b, {b.qa, b.qb}, {t * kTile, (t + 1) * kTile});
      const Iv rows = band_rows(sub);
      if (rows.empty()) continue;
      const Iv cols = band_cols(sub);
      area += band_area(sub);
      pieces.push_back({t, entry(b, cols, rows, a, a.q_buf)});
    }
  }
  WorkList w = finish(pieces);
  w.area = area;
  return w;
}

Grid grid_of(const WorkList& w, int head_slots) { return Grid{w.num_tiles(), w.empty() ? 0 : head_slots, kTile}; }

}  // namespace cpsched::gpu
