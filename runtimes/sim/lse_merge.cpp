#include "lse_merge.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace cpsched::sim {

void merge_one(float* acc_o, float& acc_lse, const float* o, float lse, int dim) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (lse == kNegInf) return;  // nothing to add (also avoids -inf - -inf = NaN)
  if (acc_lse == kNegInf) {
    acc_lse = lse;
    std::copy(o, o + dim, acc_o);
    return;
  }
  const float mx = std::max(acc_lse, lse);
  const float ea = std::exp(acc_lse - mx), eb = std::exp(lse - mx);
  const float sum = ea + eb;
  const float wa = ea / sum, wb = eb / sum;
  for (int d = 0; d < dim; ++d) acc_o[d] = wa * acc_o[d] + wb * o[d];
  acc_lse = mx + std::log(sum);
}

void merge_rows(MView acc_o, MView acc_lse, CView o, CView lse, Token rows, int heads, int dim) {
  for (Token r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h)
      merge_one(acc_o.row(r) + static_cast<std::ptrdiff_t>(h) * dim, acc_lse.row(r)[h],
                o.row(r) + static_cast<std::ptrdiff_t>(h) * dim, lse.row(r)[h], dim);
}

void add_rows(MView acc, CView src, Token rows, std::int64_t width) {
  for (Token r = 0; r < rows; ++r) {
    float* a = acc.row(r);
    const float* b = src.row(r);
    for (std::int64_t i = 0; i < width; ++i) a[i] += b[i];
  }
}

}  // namespace cpsched::sim
