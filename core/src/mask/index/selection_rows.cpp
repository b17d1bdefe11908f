// A token top-k selection as sorted rows (index_cells.hpp).
#include <algorithm>

#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/index/cells.hpp"
#include "mask/index/internal.hpp"

namespace cpsched {

SelectionRows::SelectionRows(const IndexMask& mask, int threads) : heads_(mask.kv_heads), seqlen_(mask.seqlen) {
  if (mask.kind != IndexMaskKind::topk)
    throw Error(fmt::format("selection rows: a {} mask is planned as range masks (block_selection_masks)",
                            to_string(mask.kind)));
  const Token S = seqlen_;
  const auto H = static_cast<std::size_t>(heads_);
  const std::int64_t k = mask.indices.shape.size() == 3 ? mask.indices.shape[2] : 0;
  const std::int32_t* idx = mask.indices.data;
  const auto rows = H * static_cast<std::size_t>(S);
  // Row (h, q) reads indices[q, h, :]. Counts first (one pass), then the keys.
  offset_.assign(rows + 1, 0);
  for (Token q = 0; q < S; ++q)
    for (std::size_t h = 0; h < H; ++h) {
      const std::int32_t* r = idx + (static_cast<std::size_t>(q) * H + h) * static_cast<std::size_t>(k);
      std::int64_t n = 0;
      for (std::int64_t j = 0; j < k; ++j) n += r[j] >= 0;
      offset_[h * static_cast<std::size_t>(S) + static_cast<std::size_t>(q) + 1] = n;
    }
  for (std::size_t i = 0; i < rows; ++i) offset_[i + 1] += offset_[i];
  keys_.resize(static_cast<std::size_t>(offset_[rows]));
  // At least 4096 queries per thread; each thread fills its own rows.
  const int workers =
      std::min(index_detail::resolve_threads(threads), static_cast<int>(std::min<Token>(S / 4096 + 1, 64)));
  index_detail::run_threads(workers, [&](int w) {
    for (Token q = S * w / workers; q < S * (w + 1) / workers; ++q)
      for (std::size_t h = 0; h < H; ++h) {
        const std::int32_t* r = idx + (static_cast<std::size_t>(q) * H + h) * static_cast<std::size_t>(k);
        std::int32_t* out = keys_.data() + offset_[h * static_cast<std::size_t>(S) + static_cast<std::size_t>(q)];
        std::int32_t* o = out;
        for (std::int64_t j = 0; j < k; ++j)
          if (r[j] >= 0) *o++ = r[j];
        if (!std::is_sorted(out, o)) std::sort(out, o);
      }
  });
}

std::span<const std::int32_t> SelectionRows::row(int head, Token q, Range k) const {
  const auto r = row(head, q);
  const auto* lo = std::lower_bound(r.data(), r.data() + r.size(), k.begin);
  const auto* hi = std::lower_bound(lo, r.data() + r.size(), k.end);
  return {lo, static_cast<std::size_t>(hi - lo)};
}

}  // namespace cpsched
