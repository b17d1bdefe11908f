#include "numeric_check.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace cpsched::sim {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double rel_error(const std::vector<float>& got, const std::vector<float>& ref) {
  if (got.size() != ref.size()) return kInf;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = std::abs(static_cast<double>(got[i]) - static_cast<double>(ref[i]));
    if (std::isnan(d)) return kInf;
    num = std::max(num, d);
    den = std::max(den, std::abs(static_cast<double>(ref[i])));
  }
  return num == 0 ? 0 : num / (den > 0 ? den : 1.0);
}

double lse_error(const std::vector<float>& got, const std::vector<float>& ref) {
  if (got.size() != ref.size()) return kInf;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const float a = got[i], b = ref[i];
    if (std::isnan(a) || std::isnan(b)) return kInf;
    if (std::isinf(a) || std::isinf(b)) {
      if (a != b) return kInf;
      continue;
    }
    num = std::max(num, std::abs(static_cast<double>(a) - static_cast<double>(b)));
    den = std::max(den, std::abs(static_cast<double>(b)));
  }
  return num == 0 ? 0 : num / (den > 0 ? den : 1.0);
}

}  // namespace

double NumericErrors::max() const { return std::max({o, lse, dq, dk, dv}); }

NumericErrors compare_outputs(const GlobalOutputs& got, const GlobalOutputs& ref) {
  return {rel_error(got.o, ref.o), lse_error(got.lse, ref.lse), rel_error(got.dq, ref.dq), rel_error(got.dk, ref.dk),
          rel_error(got.dv, ref.dv)};
}

}  // namespace cpsched::sim
