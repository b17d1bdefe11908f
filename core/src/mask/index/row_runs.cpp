// A rank's top-k rows as the runs of its index args (summary.hpp,
// TopkRowRuns): its summary, then one pass over its keys counting each row's
// keys per key block.
#include <algorithm>
#include <limits>

#include "cpsched/mask/index/summary.hpp"
#include "mask/index/internal.hpp"

namespace cpsched {

namespace {

// The block of a key in O(1): a table over tokens at the granularity of the
// shortest block, then at most a step or two forward.
class KeyBlocks {
 public:
  explicit KeyBlocks(const std::vector<Range>& blocks) : blocks_(blocks) {
    Token shortest = std::numeric_limits<Token>::max();
    for (Range b : blocks) shortest = std::min(shortest, b.size());
    while ((Token{2} << shift_) <= shortest) ++shift_;
    const Token S = blocks.back().end;
    lut_.resize(static_cast<std::size_t>(((S - 1) >> shift_) + 1));
    std::size_t b = 0;
    for (std::size_t i = 0; i < lut_.size(); ++i) {
      const Token t = static_cast<Token>(i) << shift_;
      while (blocks[b].end <= t) ++b;
      lut_[i] = static_cast<std::int32_t>(b);
    }
  }
  std::int32_t operator()(Token v) const {
    std::int32_t b = lut_[static_cast<std::size_t>(v >> shift_)];
    while (blocks_[static_cast<std::size_t>(b)].end <= v) ++b;
    return b;
  }

 private:
  const std::vector<Range>& blocks_;
  int shift_ = 0;
  std::vector<std::int32_t> lut_;
};

}  // namespace

TopkRowRuns summarize_topk_runs(const TopkRows& rows, const std::vector<Range>& blocks, IndexCountOptions options) {
  TopkRowRuns out;
  out.cells = summarize_topk_rows(rows, blocks, options);  // validates the rows and the blocks
  out.seqlen = rows.seqlen;
  out.causal = rows.causal;
  out.rows = rows.rows();
  out.kv_heads = rows.indices.shape.size() == 3 ? static_cast<int>(rows.indices.shape[1]) : 1;
  if (out.cells.empty()) return out;
  const std::int64_t n = out.rows.size(), H = out.kv_heads, k = rows.indices.shape[2];
  const auto nb = static_cast<std::int64_t>(blocks.size());
  const std::int64_t cell_heads = options.per_head ? H : 1;
  // count[(cell head x n + row) x nb + key block]: keys of a row in a block
  // (a merged head's row is the query with every head's keys).
  std::vector<std::int32_t> count(static_cast<std::size_t>(cell_heads * n * nb), 0);
  const KeyBlocks block_of(blocks);
  const int T = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(index_detail::resolve_threads(options.threads), n / 256)));
  index_detail::run_threads(T, [&](int t) {
    for (std::int64_t i = n * t / T; i < n * (t + 1) / T; ++i)
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int32_t* row = rows.indices.data + (i * H + h) * k;
        std::int32_t* c = count.data() + ((options.per_head ? h : 0) * n + i) * nb;
        for (std::int64_t j = 0; j < k; ++j)
          if (row[j] >= 0) ++c[block_of(row[j])];
      }
  });
  for (const IndexCell& c : out.cells)
    for (Range run : c.rows.ranges()) {
      std::int32_t width = 0;
      Token area = 0;
      for (Token q = run.begin; q < run.end; ++q) {
        const std::int32_t x = count[static_cast<std::size_t>((c.head * n + (q - out.rows.begin)) * nb + c.kblock)];
        width = std::max(width, x);
        area += x;
      }
      out.width.push_back(width);
      out.area.push_back(area);
    }
  return out;
}

}  // namespace cpsched
