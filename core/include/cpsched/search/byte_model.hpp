#pragma once
// The byte model shared by `balanced_bytes` and `ilp`: what really moves when
// tasks are placed on ranks (docs/design.md#metrics), cut into token segments so that the
// bytes of any placement are a sum of per-segment prices.
//
// For each block and direction (QO: the block as a q block, KV: as a kv
// block), the needed rows (or cols) of all cells of that block are cut at
// every range boundary into elementary intervals, the segments. A cell needs
// a whole number of segments, and the union of the needed rows of the tasks
// of one (block, group) placed on one rank is exactly the segments any of
// them needs. So the bytes of a placement are
//     sum over (segment s, group g, rank r != host(s)) with a task of group g
//     on r that needs s:  len(s) x price(direction of s)
// which is what the metrics of the core count (token-granular transfers).
#include <cstdint>
#include <span>
#include <vector>

#include <cpsched/problem/metrics.hpp>
#include <cpsched/problem/task_grid.hpp>

namespace cpsched::search {


// Weighted bytes per token of a transfer: `out` goes host -> computing rank,
// `back` computing rank -> host (O + lse forward; dQ, dK, dV backward).
struct Price {
  double out = 0;
  double back = 0;
  double sum() const { return out + back; }
};

struct Segment {
  Range tokens;        // global token range
  Rank host = 0;       // rank that hosts the tokens
  std::int32_t block = 0;
  RowKind dir = RowKind::qo;
};

class ByteModel {
 public:
  // Prices are fwd_weight x forward bytes + bwd_weight x backward bytes.
  ByteModel(const TaskGrid& grid, double fwd_weight, double bwd_weight);

  const TaskGrid& grid() const { return *grid_; }
  int ranks() const { return ranks_; }
  int groups() const { return groups_; }
  TaskId tasks() const { return grid_->num_tasks(); }
  int num_cells() const { return static_cast<int>(grid_->cells().size()); }
  int num_segments() const { return static_cast<int>(segments_.size()); }

  const Segment& segment(int s) const { return segments_[static_cast<std::size_t>(s)]; }
  const Price& price(RowKind d) const { return price_[static_cast<int>(d)]; }
  // Weighted bytes of moving segment s to one non-host rank (out + back).
  double segment_cost(int s) const { return seg_cost_[static_cast<std::size_t>(s)]; }

  // Segments a unit needs (a cell, or a task when groups have their own
  // cells, see unit_of): its q block's (QO) then its kv block's (KV).
  std::span<const std::int32_t> qo_segments(int unit) const { return span(qo_off_, unit); }
  std::span<const std::int32_t> kv_segments(int unit) const { return span(kv_off_, unit); }
  // Cells whose q block (QO) or kv block (KV) is `block`, ascending.
  std::span<const std::int32_t> cells_of(RowKind d, int block) const {
    const auto& off = block_cells_off_[static_cast<int>(d)];
    const auto b = static_cast<std::size_t>(block);
    return {block_cells_[static_cast<int>(d)].data() + off[b], static_cast<std::size_t>(off[b + 1] - off[b])};
  }
  int cell_of(TaskId t) const { return static_cast<int>(t / groups_); }
  // Whose segment lists task t reads: its cell's, or its own when the grid's
  // head groups have their own cells (TaskGrid::per_group_cells).
  int unit_of(TaskId t) const { return per_group_ ? static_cast<int>(t) : cell_of(t); }
  bool per_group() const { return per_group_; }
  int group_of(TaskId t) const { return static_cast<int>(t % groups_); }
  std::int64_t load(TaskId t) const { return grid_->load(t); }

  // Index of (segment, group) in per-(segment, group) tables.
  std::size_t slot(int s, int g) const {
    return static_cast<std::size_t>(s) * static_cast<std::size_t>(groups_) + static_cast<std::size_t>(g);
  }

 private:
  std::span<const std::int32_t> span(const std::vector<std::int32_t>& off, int cell) const {
    const auto c = static_cast<std::size_t>(cell);
    return {seg_ids_.data() + off[c], static_cast<std::size_t>(off[c + 1] - off[c])};
  }
  void build_direction(RowKind dir);

  const TaskGrid* grid_;
  int ranks_ = 0;
  int groups_ = 1;
  bool per_group_ = false;
  Price price_[2];
  std::vector<Segment> segments_;
  std::vector<double> seg_cost_;
  std::vector<std::int32_t> seg_ids_;  // both directions' lists, by cell
  std::vector<std::int32_t> qo_off_, kv_off_;
  std::vector<std::int32_t> block_cells_[2], block_cells_off_[2];
};

// Prices of one pass with unit weight, for exact byte counts.
Price qo_price(const Problem& p, double fwd_weight, double bwd_weight);
Price kv_price(const Problem& p, double fwd_weight, double bwd_weight);

}  // namespace cpsched::search
