// Pairs an attention arg computes (plan.hpp).
#include "cpsched/plan/plan.hpp"

namespace cpsched {

Token arg_area(const AttnArg& arg, const CalcMeta&) {
  return arg.is_index() ? arg.index_area : slice_area(Slice{arg.q, arg.k, arg.type});
}

}  // namespace cpsched
