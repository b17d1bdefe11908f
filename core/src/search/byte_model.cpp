#include "cpsched/search/byte_model.hpp"

#include <algorithm>

namespace cpsched::search {

Price qo_price(const Problem& p, double fwd_weight, double bwd_weight) {
  const TransferBytes f = fwd_bytes_per_token(p), b = bwd_bytes_per_token(p);
  return {fwd_weight * static_cast<double>(f.qo_out) + bwd_weight * static_cast<double>(b.qo_out),
          fwd_weight * static_cast<double>(f.qo_back) + bwd_weight * static_cast<double>(b.qo_back)};
}

Price kv_price(const Problem& p, double fwd_weight, double bwd_weight) {
  const TransferBytes f = fwd_bytes_per_token(p), b = bwd_bytes_per_token(p);
  return {fwd_weight * static_cast<double>(f.kv_out) + bwd_weight * static_cast<double>(b.kv_out),
          fwd_weight * static_cast<double>(f.kv_back) + bwd_weight * static_cast<double>(b.kv_back)};
}

ByteModel::ByteModel(const TaskGrid& grid, double fwd_weight, double bwd_weight)
    : grid_(&grid), ranks_(grid.cp_size()), groups_(grid.num_groups()), per_group_(grid.per_group_cells()) {
  price_[0] = qo_price(grid.problem(), fwd_weight, bwd_weight);
  price_[1] = kv_price(grid.problem(), fwd_weight, bwd_weight);
  const std::size_t nu = grid.cells().size() * (per_group_ ? static_cast<std::size_t>(groups_) : 1);
  qo_off_.assign(nu + 1, 0);
  kv_off_.assign(nu + 1, 0);
  build_direction(RowKind::qo);
  build_direction(RowKind::kv);
  seg_cost_.reserve(segments_.size());
  for (const Segment& s : segments_)
    seg_cost_.push_back(static_cast<double>(s.tokens.size()) * price(s.dir).sum());
}

// Cuts each block's needed token sets (rows for QO, cols for KV) into
// elementary intervals and lists, per unit (a cell, or a task when the
// grid's groups have their own cells), the segments it needs.
void ByteModel::build_direction(RowKind dir) {
  const auto& cells = grid_->cells();
  const std::size_t nc = cells.size();
  const std::size_t per = per_group_ ? static_cast<std::size_t>(groups_) : 1;  // units per cell
  const std::size_t nu = nc * per;
  const auto nb = static_cast<std::size_t>(grid_->sharding().num_blocks());
  auto block_of = [&](const Cell& c) { return static_cast<std::size_t>(dir == RowKind::qo ? c.qblock : c.kblock); };
  auto needed = [&](std::size_t unit) -> const RangeSet& {
    const Cell& c = per_group_ ? grid_->cell_of(static_cast<TaskId>(unit)) : cells[unit];
    return dir == RowKind::qo ? c.rows : c.cols;
  };

  // Cells of each block (counting sort keeps cell order inside a block).
  std::vector<std::size_t> start(nb + 1, 0);
  for (const Cell& c : cells) ++start[block_of(c) + 1];
  for (std::size_t b = 0; b < nb; ++b) start[b + 1] += start[b];
  std::vector<std::size_t> by_block(nc);
  {
    std::vector<std::size_t> fill(start.begin(), start.end() - 1);
    for (std::size_t c = 0; c < nc; ++c) by_block[fill[block_of(cells[c])]++] = c;
  }

  // Each unit's list, in block order (a unit's block writes it whole), then
  // copied out in unit order: one array instead of a vector per unit.
  std::vector<std::int32_t> flat;
  std::vector<std::size_t> list_at(nu, 0), list_len(nu, 0);
  std::vector<Token> cuts;
  std::vector<int> cover;
  std::vector<std::int32_t> seg_of_interval;
  for (std::size_t b = 0; b < nb; ++b) {
    if (start[b] == start[b + 1]) continue;
    cuts.clear();
    // (A range equal to the one just added adds no cut: a block's cells often
    // need the same rows, e.g. all of them on a causal mask.)
    Range last{-1, -1};
    for (std::size_t i = start[b]; i < start[b + 1]; ++i)
      for (std::size_t u = by_block[i] * per; u < (by_block[i] + 1) * per; ++u)
        for (Range r : needed(u).ranges()) {
          if (r == last) continue;
          last = r;
          cuts.push_back(r.begin);
          cuts.push_back(r.end);
        }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    auto index = [&](Token t) {
      return static_cast<std::size_t>(std::lower_bound(cuts.begin(), cuts.end(), t) - cuts.begin());
    };
    // Which elementary intervals some unit needs: the others are gaps.
    // (Only whether an interval is covered matters: a repeated range is skipped.)
    cover.assign(cuts.size(), 0);
    last = Range{-1, -1};
    for (std::size_t i = start[b]; i < start[b + 1]; ++i)
      for (std::size_t u = by_block[i] * per; u < (by_block[i] + 1) * per; ++u)
        for (Range r : needed(u).ranges()) {
          if (r == last) continue;
          last = r;
          ++cover[index(r.begin)];
          --cover[index(r.end)];
        }
    seg_of_interval.assign(cuts.size(), -1);
    int running = 0;
    const Rank host = grid_->sharding().host[b];
    for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
      running += cover[k];
      if (running == 0) continue;
      seg_of_interval[k] = static_cast<std::int32_t>(segments_.size());
      segments_.push_back(Segment{{cuts[k], cuts[k + 1]}, host, static_cast<std::int32_t>(b), dir});
    }
    last = Range{-1, -1};
    std::size_t last_k = 0, last_e = 0;  // the intervals of `last`
    for (std::size_t i = start[b]; i < start[b + 1]; ++i)
      for (std::size_t u = by_block[i] * per; u < (by_block[i] + 1) * per; ++u) {
        list_at[u] = flat.size();
        for (Range r : needed(u).ranges()) {
          if (r != last) last = r, last_k = index(r.begin), last_e = index(r.end);
          for (std::size_t k = last_k; k < last_e; ++k) flat.push_back(seg_of_interval[k]);
        }
        list_len[u] = flat.size() - list_at[u];
      }
  }

  auto& bc = block_cells_[static_cast<int>(dir)];
  auto& bco = block_cells_off_[static_cast<int>(dir)];
  bco.assign(start.begin(), start.end());
  bc.resize(nc);
  for (std::size_t i = 0; i < nc; ++i) bc[i] = static_cast<std::int32_t>(by_block[i]);

  auto& off = dir == RowKind::qo ? qo_off_ : kv_off_;
  seg_ids_.reserve(seg_ids_.size() + flat.size());
  for (std::size_t u = 0; u < nu; ++u) {
    off[u] = static_cast<std::int32_t>(seg_ids_.size());
    const auto first = flat.begin() + static_cast<std::ptrdiff_t>(list_at[u]);
    seg_ids_.insert(seg_ids_.end(), first, first + static_cast<std::ptrdiff_t>(list_len[u]));
  }
  off[nu] = static_cast<std::int32_t>(seg_ids_.size());
}

}  // namespace cpsched::search
