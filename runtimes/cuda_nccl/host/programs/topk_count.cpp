#include "topk_count.hpp"

#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "host_exec.hpp"

namespace cpsched::gpu {

std::vector<i64> topk_count_bounds(const TopkDims& d, const std::vector<Range>& blocks) {
  if (d.seqlen <= 0 || d.seqlen > std::numeric_limits<std::int32_t>::max() || d.heads <= 0 || d.k < 0)
    throw Error(fmt::format("top-k counting: shape [S {}, H {}, k {}] (S in [1, 2^31), H >= 1, k >= 0)", d.seqlen,
                            d.heads, d.k));
  if (blocks.empty() || blocks.front().begin != 0 || blocks.back().end != d.seqlen)
    throw Error(fmt::format("top-k counting: the {} blocks do not tile [0, {})", blocks.size(), d.seqlen));
  std::vector<i64> b;
  b.reserve(blocks.size() + 1);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].empty() || (i > 0 && blocks[i].begin != blocks[i - 1].end))
      throw Error(fmt::format("top-k counting: block {} [{}, {}) does not follow the previous one", i, blocks[i].begin,
                              blocks[i].end));
    b.push_back(blocks[i].begin);
  }
  b.push_back(d.seqlen);
  const i64 cells = static_cast<i64>(d.per_head ? d.heads : 1) * static_cast<i64>(blocks.size()) *
                    static_cast<i64>(blocks.size());
  if (cells > std::numeric_limits<std::int32_t>::max())
    throw Error(fmt::format("top-k counting: {} cells exceed the 32-bit scan", cells));
  return b;
}

std::vector<IndexCell> topk_cells_from_raw(const TopkCountRaw& raw, const TopkDims& d, int nb,
                                           const std::string& source) {
  if (raw.bad != kNoBadEntry) {
    const i64 k = d.k, H = d.heads;
    const i64 i = raw.bad / (H * k), h = raw.bad / k % H, j = raw.bad % k;
    const std::string at = fmt::format("{}: indices[{}, {}, {}] = {}", source, i, h, j, raw.bad_value);
    if (raw.bad_value < 0 || raw.bad_value >= d.seqlen) throw Error(fmt::format("{} is outside [0, {})", at, d.seqlen));
    throw Error(fmt::format("{} selects a key after query {} (causal: true)", at, i));
  }
  const int ch = d.per_head ? d.heads : 1;
  const i64 cells = static_cast<i64>(ch) * nb * nb;
  std::vector<IndexCell> out;
  for (i64 c = 0; c < cells; ++c) {
    const auto u = static_cast<std::size_t>(c);
    if (raw.area[u] == 0) continue;
    IndexCell cell;
    cell.head = static_cast<int>(c / (static_cast<i64>(nb) * nb));
    cell.qblock = static_cast<std::int32_t>(c / nb % nb);
    cell.kblock = static_cast<std::int32_t>(c % nb);
    cell.area = raw.area[u];
    std::vector<Range> rows, cols;
    for (i64 r = raw.offsets[u]; r < raw.offsets[u + 1]; ++r) {
      const Iv& x = raw.runs[static_cast<std::size_t>(r)];
      (r - raw.offsets[u] < raw.row_runs[u] ? rows : cols).push_back({x.b, x.e});
    }
    cell.rows = RangeSet(std::move(rows));
    cell.cols = RangeSet(std::move(cols));
    out.push_back(std::move(cell));
  }
  return out;
}

std::vector<IndexCell> count_topk_on_host(std::span<const std::int32_t> idx, const TopkDims& d,
                                          const std::vector<Range>& blocks, const std::string& source) {
  const std::vector<i64> bounds = topk_count_bounds(d, blocks);
  if (static_cast<i64>(idx.size()) != d.seqlen * d.heads * d.k)
    throw Error(fmt::format("{}: {} indices for shape [{}, {}, {}]", source, idx.size(), d.seqlen, d.heads, d.k));
  const int nb = static_cast<int>(blocks.size()), ch = d.per_head ? d.heads : 1;
  const i64 words = (d.seqlen + 31) / 32;
  TopkCountRaw raw;
  raw.area.assign(static_cast<std::size_t>(ch) * static_cast<std::size_t>(nb) * static_cast<std::size_t>(nb), 0);
  std::vector<std::uint32_t> col_bits(static_cast<std::size_t>(ch * nb * words), 0), row_bits(col_bits.size(), 0);
  const TopkCount c{idx.data(), d.seqlen, d.heads, d.k, d.causal ? 1 : 0, ch, bounds.data(), nb, 0, words,
                    raw.area.data(), col_bits.data(), row_bits.data(), &raw.bad};
  const i64 rows = d.seqlen * d.heads, cells = c.cells();
  run_on_host(TopkMark{c}, static_cast<int>((rows + kDataThreads - 1) / kDataThreads));
  if (raw.bad != kNoBadEntry) {
    raw.bad_value = idx[static_cast<std::size_t>(raw.bad)];
    return topk_cells_from_raw(raw, d, nb, source);  // throws
  }
  raw.offsets.assign(static_cast<std::size_t>(cells) + 1, 0);
  raw.row_runs.assign(static_cast<std::size_t>(cells), 0);
  const int ctas = static_cast<int>((cells + kDataThreads - 1) / kDataThreads);
  run_on_host(TopkRunCount{c, raw.offsets.data(), raw.row_runs.data()}, ctas);
  run_on_host(IngestScan{raw.offsets.data(), static_cast<int>(cells)}, 1);
  raw.runs.resize(static_cast<std::size_t>(raw.offsets.back()));
  run_on_host(TopkRunEmit{c, raw.offsets.data(), raw.runs.data()}, ctas);
  return topk_cells_from_raw(raw, d, nb, source);
}

}  // namespace cpsched::gpu
