#include "cpsched/hardware/kernel_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "cpsched/base/error.hpp"

namespace cpsched {

std::string_view to_string(KernelForm f) {
  switch (f) {
    case KernelForm::full: return "full";
    case KernelForm::causal: return "causal";
    case KernelForm::inv_causal: return "inv_causal";
    case KernelForm::bi_causal: return "bi_causal";
    case KernelForm::index: return "index";
  }
  return "?";
}

namespace {

// sum over i in [0, n) of floor((a i + b) / m), a, b >= 0, m > 0: the
// Euclid-like reduction (swap the roles of a and m once a < m).
std::int64_t floor_sum(std::int64_t n, std::int64_t m, std::int64_t a, std::int64_t b) {
  std::int64_t sum = 0;
  while (n > 0) {
    if (a >= m) {
      sum += n * (n - 1) / 2 * (a / m);
      a %= m;
    }
    if (b >= m) {
      sum += n * (b / m);
      b %= m;
    }
    const std::int64_t y = a * n + b;
    if (y < m) break;
    n = y / m;
    b = y % m;
    std::swap(m, a);
  }
  return sum;
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::int64_t tiles_touched(MaskType type, Token q_len, Token k_len, int tile_q, int tile_k) {
  if (q_len <= 0 || k_len <= 0) return 0;
  const std::int64_t tq = tile_q, tk = tile_k;
  const std::int64_t A = ceil_div(q_len, tq), K = ceil_div(k_len, tk);
  const std::int64_t d = k_len - q_len;  // the diagonal's offset (mask.hpp)
  switch (type) {
    case MaskType::full:
      return A * K;
    case MaskType::causal: {
      // Row i holds columns [0, i + d]. The last q tile reaches column
      // k_len - 1 (all K tiles); q tile a < A - 1 reaches (a + 1) tq - 1 + d
      // < k_len - 1, from the first a where that is >= 0.
      const std::int64_t a_lo = std::max<std::int64_t>(0, ceil_div(std::max<std::int64_t>(1 - d, 0), tq) - 1);
      const std::int64_t n = A - 1 - a_lo;
      std::int64_t t = K;
      if (n > 0) t += floor_sum(n, tk, tq, (a_lo + 1) * tq - 1 + d) + n;
      return t;
    }
    case MaskType::inv_causal: {
      // Row i holds columns [i, k_len): q tile a (from row a tq) reaches
      // tiles floor(a tq / tk) .. K - 1, while a tq < k_len.
      const std::int64_t n = std::min(A, (k_len - 1) / tq + 1);
      return n * K - floor_sum(n, tk, tq, 0);
    }
    case MaskType::bi_causal: {
      // Row i holds [i, i + d] (empty when d < 0): q tile a spans tiles
      // floor(a tq / tk) .. floor((r1 + d) / tk), r1 its last row.
      if (d < 0) return 0;
      return floor_sum(A - 1, tk, tq, tq - 1 + d) + (K - 1) - floor_sum(A, tk, tq, 0) + A;
    }
  }
  return 0;
}

std::int64_t index_tiles(Token rows, std::int64_t width, int tile_q, int tile_k) {
  if (rows <= 0 || width <= 0) return 0;
  return ceil_div(rows, tile_q) * ceil_div(width, tile_k);
}

namespace {

// The arg of a table point of form f at length L (kernel_model.hpp).
KernelArg table_arg(KernelForm f, Token L) {
  KernelArg a;
  a.form = f;
  a.q_len = L;
  a.k_len = f == KernelForm::bi_causal ? 2 * L : L;
  a.width = f == KernelForm::index ? L : 0;
  a.area = f == KernelForm::index ? L * L
                                  : slice_area(Slice{{0, a.q_len}, {0, a.k_len}, static_cast<MaskType>(static_cast<int>(f))});
  return a;
}

std::int64_t arg_tiles(const KernelArg& a, int tq, int tk) {
  return a.form == KernelForm::index ? index_tiles(a.q_len, a.width, tq, tk)
                                     : tiles_touched(static_cast<MaskType>(static_cast<int>(a.form)), a.q_len, a.k_len, tq, tk);
}

// Linear in log2(length) between the table's points (x, and lx their
// log2), clamped at its ends.
double interpolate(const std::vector<double>& x, const std::vector<double>& lx, const std::vector<double>& y,
                   double length) {
  if (length <= x.front()) return y.front();
  if (length >= x.back()) return y.back();
  const auto it = std::upper_bound(x.begin(), x.end(), length);
  const std::size_t i = static_cast<std::size_t>(it - x.begin());
  const double w = (std::log2(length) - lx[i - 1]) / (lx[i] - lx[i - 1]);
  return y[i - 1] + w * (y[i] - y[i - 1]);
}

}  // namespace

void KernelRates::finish() {
  if (tile_q < 1 || tile_k < 1) throw Error("tiles must be at least 1 x 1");
  if (lengths.empty()) throw Error("the table has no lengths");
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    if (!(lengths[i] >= 1) || lengths[i] != std::floor(lengths[i]))
      throw Error(fmt::format("length {} is not a whole number of at least 1", lengths[i]));
    if (i > 0 && !(lengths[i] > lengths[i - 1])) throw Error("lengths must be strictly ascending");
  }
  log2_lengths.clear();
  for (double l : lengths) log2_lengths.push_back(std::log2(l));
  bool any = false;
  for (int f = 0; f < kKernelForms; ++f) {
    const auto uf = static_cast<std::size_t>(f);
    tile_tflops[uf].clear();
    area_tflops[uf].clear();
    if (alias[uf] >= 0) continue;
    if (tflops[uf].empty()) continue;
    any = true;
    if (tflops[uf].size() != lengths.size())
      throw Error(fmt::format("the {} row has {} rates for {} lengths", to_string(static_cast<KernelForm>(f)),
                              tflops[uf].size(), lengths.size()));
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      const double r = tflops[uf][i];
      const KernelArg a = table_arg(static_cast<KernelForm>(f), static_cast<Token>(lengths[i]));
      const double tile_area = static_cast<double>(arg_tiles(a, tile_q, tile_k)) * tile_q * tile_k;
      // The same time for that arg, its FLOPs counted in tiles.
      tile_tflops[uf].push_back(r * tile_area / static_cast<double>(a.area));
      area_tflops[uf].push_back(r);
    }
  }
  if (!any) throw Error("the table holds no form");
  for (int f = 0; f < kKernelForms; ++f) {
    const auto uf = static_cast<std::size_t>(f);
    const int to = alias[uf];
    if (to < 0) continue;
    if (to >= kKernelForms || alias[static_cast<std::size_t>(to)] >= 0 || tflops[static_cast<std::size_t>(to)].empty())
      throw Error(fmt::format("{} takes the rates of {}, which has no row of its own",
                              to_string(static_cast<KernelForm>(f)),
                              to >= 0 && to < kKernelForms ? to_string(static_cast<KernelForm>(to)) : "?"));
    tile_tflops[uf] = tile_tflops[static_cast<std::size_t>(to)];
    area_tflops[uf] = area_tflops[static_cast<std::size_t>(to)];
  }
}

double KernelRates::tile_rate(KernelForm f, double length) const {
  return interpolate(lengths, log2_lengths, tile_tflops[static_cast<std::size_t>(f)], length);
}

double KernelRates::area_rate(KernelForm f, double length) const {
  return interpolate(lengths, log2_lengths, area_tflops[static_cast<std::size_t>(f)], length);
}

double KernelModel::arg_seconds(Pass p, const KernelArg& a, double flops_per_pair, double peak_tflops) const {
  const KernelRates& r = pass(p);
  if (!r.holds(a.form)) return static_cast<double>(a.area) * flops_per_pair / (peak_tflops * 1e12);
  const bool index = a.form == KernelForm::index;
  // The kernel's inner loop: keys (index entries) forward, queries backward.
  const double length = static_cast<double>(p == Pass::fwd ? (index ? a.width : a.k_len) : a.q_len);
  double s;
  if (count_tiles) {
    const double work = static_cast<double>(arg_tiles(a, r.tile_q, r.tile_k)) * r.tile_q * r.tile_k;
    s = work * flops_per_pair / (r.tile_rate(a.form, length) * 1e12);
  } else {
    s = static_cast<double>(a.area) * flops_per_pair / (r.area_rate(a.form, length) * 1e12);
  }
  return s + r.entry_us * 1e-6;
}

}  // namespace cpsched
