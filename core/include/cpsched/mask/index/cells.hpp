#pragma once
// The grid's view of an index mask: per (query block, key block, head) the
// selected pairs, the query rows with any selection, and the union of the
// selected keys. Built in one multi-threaded pass over the indices, which
// also validates them (IndexMask::validate's checks and errors).
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "cpsched/base/buffer_recycler.hpp"
#include "cpsched/base/range.hpp"
#include "cpsched/mask/index/index_mask.hpp"

namespace cpsched {

struct TopkRows;  // summary.hpp: one rank's rows

struct IndexCell {
  std::int32_t qblock = 0;
  std::int32_t kblock = 0;
  int head = 0;        // selection head; 0 when heads are merged
  Token area = 0;      // selected (query, key) pairs
  RangeSet rows;       // query tokens with any selected key in the cell (global)
  RangeSet cols;       // distinct selected keys in the cell (global)
  friend bool operator==(const IndexCell&, const IndexCell&) = default;
};

struct IndexCountOptions {
  // Per head (mask.kv_heads cells per block pair), or merged: areas summed
  // over heads, rows and cols united (a task computes all heads).
  bool per_head = true;
  // > 0: that many threads (at most one per query row); <= 0: the
  // hardware's, fewer on small inputs. Rows are cut between threads
  // anywhere, inside a query block too; the cells are the same.
  int threads = 0;
};

// `blocks` tile [0, S) in order (Sharding::blocks). The non-empty cells,
// sorted by (head, qblock, kblock). The result does not depend on the
// thread count. Throws cpsched::Error as IndexMask::validate.
std::vector<IndexCell> count_index_cells(const IndexMask& mask, const std::vector<Range>& blocks,
                                         IndexCountOptions options = {});

// What a grid and its plan will hold for a token top-k mask over `blocks`,
// counted before either is built (resources.hpp): one multi-threaded pass
// over the indices, O(cell_heads x blocks) memory per thread, nothing in
// proportion to the indices. The mask must be valid (validate() first);
// entries outside [0, S) are skipped. Per (head, query block, key block) cell
// with a selection: `rows` query rows select keys in it and the widest of
// them selects `width`; an index arg pads each of its rows to its widest, so
// rows x width bounds the cell's index-pool entries in a plan (exact when
// the cell's rows form one run).
struct IndexPlanCounts {
  std::int64_t pairs = 0;        // selected (query, key) pairs, all heads
  std::int64_t cells = 0;        // non-empty cells, all heads
  std::int64_t pool = 0;         // sum over cells of rows x width
  std::int64_t row_ranges = 0;   // bound on the ranges of the cells' rows (RangeSet entries)
  std::int64_t col_ranges = 0;   // bound on the ranges of the cells' distinct keys
};
IndexPlanCounts count_index_plan(const IndexMask& mask, const std::vector<Range>& blocks,
                                 IndexCountOptions options = {});

// A token top-k selection as sorted rows: the valid keys of (head h, query
// q), ascending, for the plan builder, the validator and the simulator
// (which look up a query's keys inside a block). Built once per grid, on
// first use; the mask must be valid (validate() / count_index_cells first).
// From one rank's rows (TopkRows, summary.hpp) it holds only those queries:
// asking for another is an error (a plan arg of a query the rank does not
// hold); its key store may come from `buffers` (a Session's recycler, reused
// call after call; null: a new one).
class SelectionRows {
 public:
  explicit SelectionRows(const IndexMask& mask, int threads = 0);
  explicit SelectionRows(const TopkRows& rows, int threads = 0, BufferRecycler* buffers = nullptr);
  int heads() const { return heads_; }
  Token seqlen() const { return seqlen_; }
  Range queries() const { return {first_, first_ + rows_}; }
  std::int64_t keys() const { return num_keys_; }
  std::span<const std::int32_t> row(int head, Token q) const {
    if (q < first_ || q >= first_ + rows_) not_held(q);
    const auto i = static_cast<std::size_t>(head) * static_cast<std::size_t>(rows_) + static_cast<std::size_t>(q - first_);
    return {keys_.get() + offset_[i], static_cast<std::size_t>(offset_[i + 1] - offset_[i])};
  }
  // The keys of row (head, q) inside [k.begin, k.end).
  std::span<const std::int32_t> row(int head, Token q, Range k) const;

 private:
  void build(const std::int32_t* idx, std::int64_t k, int threads, BufferRecycler* buffers);
  [[noreturn]] void not_held(Token q) const;
  int heads_ = 1;
  Token seqlen_ = 0;
  Token first_ = 0, rows_ = 0;        // the queries held: [first_, first_ + rows_)
  std::vector<std::int64_t> offset_;  // [heads * rows + 1]
  // Written whole by build(), so allocated without the zero fill (a rank's
  // DSA rows are 32 MiB: the fill was a pass of its own).
  std::shared_ptr<std::int32_t[]> keys_;
  std::int64_t num_keys_ = 0;
};

// SelectionRows made once, on first use, and shared by every grid of a
// problem (the solvers' own shardings included). Thread safe.
class SelectionRowsCache {
 public:
  SelectionRowsCache() = default;
  // Rows made already (one rank's, summary.hpp): get() returns them.
  explicit SelectionRowsCache(std::unique_ptr<const SelectionRows> made) : rows_(std::move(made)), made_(true) {
    std::call_once(once_, [] {});
  }
  const SelectionRows& get(const IndexMask& mask) const {
    std::call_once(once_, [&] { rows_ = std::make_unique<const SelectionRows>(mask); });
    return *rows_;
  }
  // The rows given at construction, or null (then get() makes them).
  const SelectionRows* made() const { return made_ ? rows_.get() : nullptr; }

 private:
  mutable std::once_flag once_;
  mutable std::unique_ptr<const SelectionRows> rows_;
  bool made_ = false;
};

}  // namespace cpsched
