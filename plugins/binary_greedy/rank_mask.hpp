#pragma once
// Sets of ranks as fixed-width bitmasks of W 64-bit words (P <= 64 * W).
// The solver picks the smallest W in {1, 2, 4, 8, 16} that holds P at run
// time, so P <= 64 runs on single words and P = 1024 on 16.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>

namespace cpsched::bg {

using Word = std::uint64_t;

// Without a popcount instruction in the target (plain x86-64), std::popcount
// is a library call; the inline bit-slicing form is faster there.
inline int popcount64(Word x) {
#if defined(__POPCNT__) || !defined(__x86_64__)
  return std::popcount(x);
#else
  x = x - ((x >> 1) & 0x5555555555555555ULL);
  x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
  return static_cast<int>((x * 0x0101010101010101ULL) >> 56);
#endif
}

template <int W>
struct RankMask {
  static constexpr int words = W;

  static bool test(const Word* m, int r) { return ((m[r >> 6] >> (r & 63)) & 1U) != 0; }
  static void set(Word* m, int r) { m[r >> 6] |= Word{1} << (r & 63); }
  static void clear(Word* m) {
    for (int w = 0; w < W; ++w) m[w] = 0;
  }
  static void only(Word* m, int r) {
    clear(m);
    set(m, r);
  }
  // The ranks [0, P).
  static void first(Word* m, int P) {
    for (int w = 0; w < W; ++w) {
      const int lo = w * 64;
      m[w] = P >= lo + 64 ? ~Word{0} : (P > lo ? (Word{1} << (P - lo)) - 1 : Word{0});
    }
  }
  static void and_of(Word* out, const Word* a, const Word* b) {
    for (int w = 0; w < W; ++w) out[w] = a[w] & b[w];
  }
  static int count_and(const Word* a, const Word* b) {
    int n = 0;
    for (int w = 0; w < W; ++w) n += popcount64(a[w] & b[w]);
    return n;
  }
  // Calls f(r) for every rank in m, in increasing order.
  template <class F>
  static void for_each(const Word* m, F&& f) {
    for (int w = 0; w < W; ++w) {
      for (Word x = m[w]; x != 0; x &= x - 1) f(w * 64 + std::countr_zero(x));
    }
  }
};

// The lowest rank r of m with the smallest load[r] + add, or -1 when m is
// empty or no rank beats `bound` (strictly). Scans the set bits when m is
// sparse; when it is dense, a branch-free pass with four independent minima
// (min is exact, so any grouping gives the same value) and a second pass for
// the first rank at that value are faster.
template <int W>
inline int argmin_load(const Word* m, int degree, const double* load, int P, double add, double bound) {
  int best_r = -1;
  if (degree * 4 < P) {
    double best = bound;
    RankMask<W>::for_each(m, [&](int r) {
      const double v = load[r] + add;
      if (v < best) {
        best = v;
        best_r = r;
      }
    });
    return best_r;
  }
  constexpr double inf = std::numeric_limits<double>::infinity();
  double lane[4] = {inf, inf, inf, inf};
  int r = 0;
  for (; r + 4 <= P; r += 4)
    for (int k = 0; k < 4; ++k) {
      const double v = RankMask<W>::test(m, r + k) ? load[r + k] + add : inf;
      lane[k] = v < lane[k] ? v : lane[k];
    }
  for (; r < P; ++r) {
    const double v = RankMask<W>::test(m, r) ? load[r] + add : inf;
    lane[0] = v < lane[0] ? v : lane[0];
  }
  const double best = std::min(std::min(lane[0], lane[1]), std::min(lane[2], lane[3]));
  if (!(best < bound)) return -1;
  for (r = 0; r < P; ++r)
    if (RankMask<W>::test(m, r) && load[r] + add == best) return r;
  return -1;
}

// Words needed for P ranks, rounded up to a supported width.
inline int mask_words(int P) {
  const int need = (P + 63) / 64;
  int w = 1;
  while (w < need) w *= 2;
  return w;
}

}  // namespace cpsched::bg
