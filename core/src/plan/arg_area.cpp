// Pairs an attention arg computes (plan.hpp).
#include "cpsched/plan/plan.hpp"
#include "cpsched/problem/resources.hpp"

namespace cpsched {

static_assert(sizeof(AttnArg) == kPlanArgBytes,
              "problem/resources.hpp's plan estimate counts kPlanArgBytes per arg: update it with AttnArg");

Token arg_area(const AttnArg& arg, const CalcMeta&) {
  return arg.is_index() ? arg.index_area : slice_area(Slice{arg.q, arg.k, arg.type});
}

}  // namespace cpsched
