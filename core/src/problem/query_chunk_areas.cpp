// Computed pairs per query chunk (problem.hpp).
#include <algorithm>

#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "cpsched/problem/problem.hpp"

namespace cpsched {

std::vector<Token> query_chunk_areas(const Problem& p, Token chunk) {
  if (chunk < 1) throw Error(fmt::format("query_chunk_areas: chunk must be at least 1 token, got {}", chunk));
  const Token S = p.seqlen();
  const auto n = static_cast<std::size_t>((S + chunk - 1) / chunk);
  std::vector<Token> area(n, 0);
  const Range all{0, S};
  auto add = [&](const RangeMask& mask) {
    // Each slice only touches the chunks its q range overlaps.
    for (const Slice& s : mask.slices())
      for (Token i = s.q.begin / chunk; i < static_cast<Token>(n) && i * chunk < s.q.end; ++i) {
        const Range q{i * chunk, std::min((i + 1) * chunk, S)};
        area[static_cast<std::size_t>(i)] += slice_area(s, q, all);
      }
  };
  if (p.index_mask) {
    const IndexMask& m = *p.index_mask;
    const std::int64_t per_row = m.kv_heads * m.indices.shape.at(2);
    for (Token q = 0; q < S; ++q) {
      const std::int32_t* r = m.indices.data + q * per_row;
      area[static_cast<std::size_t>(q / chunk)] += std::count_if(r, r + per_row, [](std::int32_t e) { return e >= 0; });
    }
  } else if (!p.head_masks.empty()) {
    for (const RangeMask& m : p.head_masks) add(m);
  } else {
    add(p.mask);
  }
  return area;
}

}  // namespace cpsched
