// Pairs an attention arg computes (plan.hpp).
#include <algorithm>

#include "cpsched/plan.hpp"

namespace cpsched {

Token arg_area(const AttnArg& arg, const CalcMeta& calc) {
  if (!arg.is_index()) return slice_area(Slice{arg.q, arg.k, arg.type});
  const auto begin = calc.indices.begin() + arg.index_offset;
  return std::count_if(begin, begin + arg.q.size() * arg.index_width, [](std::int32_t e) { return e >= 0; });
}

}  // namespace cpsched
