// A problem's mask as a dense S x S table (problem.hpp), for references.
#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "cpsched/problem/problem.hpp"

namespace cpsched {

std::vector<std::uint8_t> dense_mask(const Problem& p, int group) {
  const Token S = p.seqlen();
  if (static_cast<double>(S) * static_cast<double>(S) > static_cast<double>(std::int64_t{1} << 32))
    throw Error(fmt::format("dense_mask: S = {} is too large for an S x S table", S));
  const auto SS = static_cast<std::size_t>(S);
  std::vector<std::uint8_t> m(SS * SS, 0);
  auto add_slices = [&](const RangeMask& mask) {
    for (const Slice& s : mask.slices())
      for (Token q = s.q.begin; q < s.q.end; ++q)
        for (Token k = s.k.begin; k < s.k.end; ++k)
          if (slice_contains(s, q, k)) m[static_cast<std::size_t>(q) * SS + static_cast<std::size_t>(k)] = 1;
  };
  if (p.index_mask) {
    const IndexMask& x = *p.index_mask;
    const int h = x.kv_heads > 1 ? group : 0;
    if (h < 0 || h >= x.kv_heads) throw Error(fmt::format("dense_mask: group {} outside the mask's {} heads", group, x.kv_heads));
    const std::int64_t k = x.indices.shape.at(2);
    for (Token q = 0; q < S; ++q) {
      const std::int32_t* r = x.indices.data + (q * x.kv_heads + h) * k;
      for (std::int64_t j = 0; j < k; ++j)
        if (r[j] >= 0) m[static_cast<std::size_t>(q) * SS + static_cast<std::size_t>(r[j])] = 1;
    }
  } else if (!p.head_masks.empty()) {
    if (group < 0 || group >= static_cast<int>(p.head_masks.size()))
      throw Error(fmt::format("dense_mask: group {} outside the problem's {} head masks", group, p.head_masks.size()));
    add_slices(p.head_masks[static_cast<std::size_t>(group)]);
  } else {
    add_slices(p.mask);
  }
  return m;
}

}  // namespace cpsched
