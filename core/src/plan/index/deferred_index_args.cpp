// The index args of one rank's tasks from its row runs (Problem::index_row_runs):
// the shapes rank_index_args gives from the rows, without the rows; the
// executor writes the pool (CalcMeta::deferred_index_entries).
#include <algorithm>
#include <tuple>

#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "plan/builder/buffer_map.hpp"
#include "plan/builder/internal.hpp"

namespace cpsched::plan_detail {

namespace {

// The runs of a rank's row runs (TopkRowRuns) by cell: where each cell's
// runs start in width / area.
class RunIndex {
 public:
  explicit RunIndex(const TopkRowRuns& r) : r_(r) {
    std::size_t at = 0;
    first_.reserve(r.cells.size());
    for (const IndexCell& c : r.cells) {
      first_.push_back(at);
      at += c.rows.ranges().size();
    }
  }
  // The cell (head, qblock, kblock) and the index of its first run.
  std::pair<const IndexCell*, std::size_t> find(int head, std::int32_t qblock, std::int32_t kblock) const {
    const auto key = std::make_tuple(head, qblock, kblock);
    const auto it = std::lower_bound(r_.cells.begin(), r_.cells.end(), key, [](const IndexCell& c, const auto& k) {
      return std::make_tuple(c.head, c.qblock, c.kblock) < k;
    });
    if (it == r_.cells.end() || std::make_tuple(it->head, it->qblock, it->kblock) != key)
      throw Error(fmt::format("plan builder (internal): the row runs have no cell (head {}, qblock {}, kblock {})",
                              head, qblock, kblock));
    return {&*it, first_[static_cast<std::size_t>(it - r_.cells.begin())]};
  }
  const TopkRowRuns& runs() const { return r_; }

 private:
  const TopkRowRuns& r_;
  std::vector<std::size_t> first_;
};

// Index args of one task: one per run of its cell's rows (contiguous in the
// q buffer), with the run's width and pairs, and the pool entries counted in
// `entries` instead of written.
void emit_deferred(const RunIndex& index, int head, const Cell& c, const BufferMap& qm, const BufferMap& km,
                   int group, std::vector<BufferMap::Run>& runs, std::vector<AttnArg>& out, std::int64_t& entries) {
  if (c.rows.empty()) return;  // a head group that selects nothing in the cell, where another one does
  const auto [cell, first] = index.find(head, c.qblock, c.kblock);
  if (cell->rows != c.rows)
    throw Error(fmt::format("plan builder (internal): the grid's cell (qblock {}, kblock {}) has other rows than the "
                            "row runs' (a grid of other blocks?)",
                            c.qblock, c.kblock));
  const Range k = {km.row_of(c.cols.ranges().front().begin), km.row_of(c.cols.ranges().back().end - 1) + 1};
  std::size_t at = first;
  for (Range rows : c.rows.ranges()) {
    if (!qm.runs(rows, runs) || runs.size() != 1)
      throw Error(fmt::format("plan builder (internal): rows [{}, {}) are not one run of the q buffer", rows.begin,
                              rows.end));
    const BufferMap::Run& run = runs.front();
    const std::int32_t width = index.runs().width[at];
    out.push_back(AttnArg{{run.global.begin + run.shift, run.global.end + run.shift}, k, MaskType::full, qm.buf,
                          km.buf, group, width, entries, index.runs().area[at]});
    entries += static_cast<std::int64_t>(rows.size()) * width;
    ++at;
  }
}

}  // namespace

RankIndexArgs rank_deferred_index_args(const Assignment& a, const Transfers& tr, const XferLayout& where,
                                       std::size_t d) {
  const TaskGrid& g = *a.grid;
  const RunIndex index(*g.problem().index_row_runs);
  const BufferMaps maps{g.sharding(), where};
  const std::size_t first = tr.rank_begin[d], n = tr.rank_begin[d + 1] - first;
  RankIndexArgs out;
  out.args.resize(n);
  std::vector<BufferMap::Run> runs;
  for (std::size_t i = 0; i < n; ++i) {
    const PlacedTask p = placed_task(g, tr, first + i);
    const Cell& c = *p.cell;
    emit_deferred(index, g.per_group_cells() ? p.group : 0, c, maps.of(p.xq, c.qblock), maps.of(p.xk, c.kblock),
                  p.group, runs, out.args[i], out.deferred_entries);
  }
  return out;
}

}  // namespace cpsched::plan_detail
