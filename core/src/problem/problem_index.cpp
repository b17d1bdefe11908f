// Problems of index masks (problem.hpp).
#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "cpsched/problem/problem.hpp"

namespace cpsched {

Problem Problem::make(std::shared_ptr<const IndexMask> mask, int cp_size, Heads heads, GridOptions grid) {
  if (!mask) throw Error("problem: no index mask given");
  if (mask->kv_heads != 1 && mask->kv_heads != heads.kv)
    throw Error(fmt::format("problem: the index mask selects for {} KV heads but heads.kv = {}; a selection is "
                            "shared by all heads (1) or per KV head ({})",
                            mask->kv_heads, heads.kv, heads.kv));
  if (mask->kv_heads > 1 && !grid.flatten_head_groups)
    throw Error(fmt::format("problem: the index mask selects per KV head ({} heads), which needs flattened head "
                            "groups (problem.grid.flatten_head_groups: true)",
                            mask->kv_heads));
  if (mask->kind == IndexMaskKind::topk) {
    mask->validate();
    Problem p = make(RangeMask(mask->seqlen, {}), cp_size, heads, grid);
    p.index_mask = std::move(mask);
    p.selection_rows = std::make_shared<const SelectionRowsCache>();
    return p;
  }
  std::vector<RangeMask> per_head = block_selection_masks(*mask);
  if (per_head.size() == 1) return make(std::move(per_head.front()), cp_size, heads, grid);
  Problem p = make(RangeMask(mask->seqlen, {}), cp_size, heads, grid);
  p.head_masks = std::move(per_head);
  for (const RangeMask& m : p.head_masks) m.validate();
  return p;
}

}  // namespace cpsched
