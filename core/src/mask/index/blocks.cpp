// block_selection_masks (index_mask.hpp): block selections (block_topk, bsr)
// as one exact range mask per selection head.
//
// Per head, each query block's selected key blocks (partial and full lists
// together) are sorted and merged into runs of adjacent blocks; consecutive
// query blocks with the same runs form one group. A group's query range Q
// and a run's key range K give full slices, or, when causal and the
// rectangle straddles the token diagonal (pairs k <= q only):
//   keys at or after Q.end are never visible: cut K to Kc = [K.begin, Q.end);
//   all of Kc visible from Q.begin on: one full slice;
//   else a causal slice [max(Q.begin, Kc.begin), Kc.end) x Kc, whose query
//   and key ranges end together, so mask.hpp's bottom-right causal is exactly
//   k <= q, plus a full slice [Kc.end, Q.end) x Kc for the rows below.
// Runs have disjoint keys and groups disjoint queries, so no slices overlap.
#include <fmt/format.h>

#include <algorithm>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/index/index_mask.hpp"
#include "mask/index/internal.hpp"

namespace cpsched {

using namespace index_detail;

namespace {

using Runs = std::vector<std::pair<std::int64_t, std::int64_t>>;  // [first, last + 1) key blocks

void emit(const IndexMask& m, Range q, const Runs& runs, std::vector<Slice>& out) {
  for (const auto& [a, b] : runs) {
    const Range k{a * m.block_k, std::min<Token>(m.seqlen, b * m.block_k)};
    if (!m.causal) {
      out.push_back({q, k, MaskType::full});
      continue;
    }
    const Range kc{k.begin, std::min(k.end, q.end)};
    if (kc.empty()) continue;  // validate() rejects such blocks; kept for safety
    if (kc.end - 1 <= q.begin) {
      out.push_back({q, kc, MaskType::full});
      continue;
    }
    out.push_back({{std::max(q.begin, kc.begin), kc.end}, kc, MaskType::causal});
    if (q.end > kc.end) out.push_back({{kc.end, q.end}, kc, MaskType::full});
  }
}

RangeMask head_mask(const IndexMask& m, const BlockRows& rows, std::int64_t h) {
  const std::int64_t nqb = m.num_query_blocks();
  const bool padded = m.kind == IndexMaskKind::block_topk;
  std::vector<Slice> slices;
  std::vector<std::int64_t> sel;
  Runs runs, group_runs;
  Token group_begin = 0;
  for (std::int64_t qb = 0; qb < nqb; ++qb) {
    sel.clear();
    const auto [pa, pb] = rows.partial(h, qb);
    for (std::int64_t p = pa; p < pb; ++p)
      if (!padded || m.indices.data[p] != -1) sel.push_back(m.indices.data[p]);
    const auto [fa, fb] = rows.full(h, qb);
    for (std::int64_t p = fa; p < fb; ++p) sel.push_back(m.full_indices.data[p]);
    std::sort(sel.begin(), sel.end());
    runs.clear();
    for (std::int64_t b : sel) {
      if (!runs.empty() && runs.back().second == b)
        runs.back().second = b + 1;
      else
        runs.push_back({b, b + 1});
    }
    const Range q = query_block(m, qb);
    if (qb > 0 && runs == group_runs) continue;  // same row as the group: it grows
    emit(m, {group_begin, q.begin}, group_runs, slices);
    group_runs.swap(runs);
    group_begin = q.begin;
  }
  emit(m, {group_begin, m.seqlen}, group_runs, slices);
  return RangeMask(m.seqlen, std::move(slices));
}

}  // namespace

std::vector<RangeMask> block_selection_masks(const IndexMask& mask, int threads) {
  if (mask.kind == IndexMaskKind::topk)
    throw Error("block_selection_masks: a topk mask is not a block selection; use count_index_cells");
  mask.validate(threads);
  const BlockRows rows(mask);
  std::vector<RangeMask> out(static_cast<std::size_t>(mask.kv_heads));
  const int T = std::min(resolve_threads(threads), mask.kv_heads);
  run_threads(T, [&](int t) {
    for (std::int64_t h = t; h < mask.kv_heads; h += T) out[static_cast<std::size_t>(h)] = head_mask(mask, rows, h);
  });
  return out;
}

}  // namespace cpsched
