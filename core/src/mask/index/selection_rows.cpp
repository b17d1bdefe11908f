// A token top-k selection as sorted rows (index_cells.hpp).
#include <algorithm>
#include <limits>
#include <memory>

#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/index/cells.hpp"
#include "cpsched/mask/index/summary.hpp"
#include "mask/index/internal.hpp"

namespace cpsched {

SelectionRows::SelectionRows(const IndexMask& mask, int threads)
    : heads_(mask.kv_heads), seqlen_(mask.seqlen), first_(0), rows_(mask.seqlen) {
  if (mask.kind != IndexMaskKind::topk)
    throw Error(fmt::format("selection rows: a {} mask is planned as range masks (block_selection_masks)",
                            to_string(mask.kind)));
  build(mask.indices.data, mask.indices.shape.size() == 3 ? mask.indices.shape[2] : 0, threads, nullptr);
}

SelectionRows::SelectionRows(const TopkRows& rows, int threads, BufferRecycler* buffers)
    : heads_(rows.indices.shape.size() == 3 ? static_cast<int>(rows.indices.shape[1]) : 1),
      seqlen_(rows.seqlen),
      first_(rows.first_row),
      rows_(rows.rows().size()) {
  if (rows.indices.shape.size() != 3)
    throw Error(fmt::format("selection rows: {}: expected a rank's rows [rows, H_kv, k]",
                            index_detail::source_of(rows.indices, "indices")));
  build(rows.indices.data, rows.indices.shape[2], threads, buffers);
}

void SelectionRows::not_held(Token q) const {
  throw Error(fmt::format("selection rows: query {} is not among the rows held, [{}, {}) (one rank's rows: its plan "
                          "can only compute its own queries)",
                          q, first_, first_ + rows_));
}

// Row (h, q) reads idx[(q - first_), h, :]. Counts first, then copies the
// keys; each pass splits the queries over the same workers.
void SelectionRows::build(const std::int32_t* idx, std::int64_t k, int threads, BufferRecycler* buffers) {
  const Token n = rows_;
  const auto H = static_cast<std::size_t>(heads_);
  const auto rows = H * static_cast<std::size_t>(n);
  offset_.assign(rows + 1, 0);
  // At least 64k entries per worker (a thread costs more below that).
  const int workers = static_cast<int>(std::clamp<std::int64_t>(
      n * static_cast<std::int64_t>(H) * k / 65536, 1, std::min(index_detail::resolve_threads(threads), 64)));
  auto each_row = [&](auto&& fn) {
    index_detail::run_threads(workers, [&](int w) {
      for (Token q = n * w / workers; q < n * (w + 1) / workers; ++q)
        for (std::size_t h = 0; h < H; ++h)
          fn(idx + (static_cast<std::size_t>(q) * H + h) * static_cast<std::size_t>(k),
             h * static_cast<std::size_t>(n) + static_cast<std::size_t>(q));
    });
  };
  each_row([&](const std::int32_t* r, std::size_t i) {
    std::int64_t c = 0;
    for (std::int64_t j = 0; j < k;) {  // 32-bit counts: twice the lanes of 64-bit ones
      const std::int64_t stop = std::min<std::int64_t>(k, j + std::numeric_limits<std::int32_t>::max());
      std::uint32_t valid = 0;
      for (; j < stop; ++j) valid += r[j] >= 0 ? 1 : 0;
      c += valid;
    }
    offset_[i + 1] = c;
  });
  for (std::size_t i = 0; i < rows; ++i) offset_[i + 1] += offset_[i];
  num_keys_ = offset_[rows];
  keys_ = take_buffer(buffers, static_cast<std::size_t>(num_keys_));
  each_row([&](const std::int32_t* r, std::size_t i) {
    std::int32_t* out = keys_.get() + offset_[i];
    const std::int64_t c = offset_[i + 1] - offset_[i];
    // The usual layout (the valid entries first, ascending, then -1s): one
    // copy and one branch-free check. Ascending from >= 0, the first c are
    // valid, so they are all of the row's.
    std::copy_n(r, c, out);
    int descents = c > 0 && out[0] < 0;
    for (std::int64_t j = 1; j < c; ++j) descents |= out[j] < out[j - 1];
    if (descents == 0) return;
    std::int32_t* o = out;
    for (std::int64_t j = 0; j < k; ++j)
      if (r[j] >= 0) *o++ = r[j];
    if (!std::is_sorted(out, o)) std::sort(out, o);
  });
}

std::span<const std::int32_t> SelectionRows::row(int head, Token q, Range k) const {
  const auto r = row(head, q);
  const auto* lo = std::lower_bound(r.data(), r.data() + r.size(), k.begin);
  const auto* hi = std::lower_bound(lo, r.data() + r.size(), k.end);
  return {lo, static_cast<std::size_t>(hi - lo)};
}

}  // namespace cpsched
