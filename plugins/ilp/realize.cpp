#include "realize.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>

#include "cpsched/search/state.hpp"

namespace cpsched::ilp {

namespace {

// Each cell's groups are handed out to ranks in the order `rank_order`, so
// cells with similar counts get the same groups on the same rank.
std::vector<Rank> layout(const search::ByteModel& m, const std::vector<int>& counts, const std::vector<Rank>& rank_order) {
  const int G = m.groups(), P = m.ranks();
  std::vector<Rank> p(static_cast<std::size_t>(m.tasks()), 0);
  for (int c = 0; c < m.num_cells(); ++c) {
    int g = 0;
    for (Rank r : rank_order)
      for (int k = 0; k < counts[static_cast<std::size_t>(c) * static_cast<std::size_t>(P) + static_cast<std::size_t>(r)]; ++k)
        p[static_cast<std::size_t>(c) * static_cast<std::size_t>(G) + static_cast<std::size_t>(g++)] = r;
  }
  return p;
}

// Swaps of two groups of one cell between their ranks while any improves.
void swap_descent(search::State& st) {
  const search::ByteModel& m = st.model();
  const int G = m.groups();
  bool improved = true;
  while (improved) {
    improved = false;
    for (int c = 0; c < m.num_cells(); ++c)
      for (int g1 = 0; g1 < G; ++g1)
        for (int g2 = g1 + 1; g2 < G; ++g2) {
          const TaskId t1 = static_cast<TaskId>(c) * G + g1, t2 = static_cast<TaskId>(c) * G + g2;
          const Rank r1 = st.rank(t1), r2 = st.rank(t2);
          if (r1 == r2) continue;
          const double d1 = st.delta(t1, r2);
          st.move(t1, r2);
          const double d2 = st.delta(t2, r1);
          if (d1 + d2 < -1e-6) {
            st.move(t2, r1);
            improved = true;
          } else {
            st.move(t1, r1);
          }
        }
  }
}

}  // namespace

std::vector<Rank> realize(const search::ByteModel& m, const std::vector<int>& counts, int starts,
                          double bottleneck_weight) {
  const int P = m.ranks();
  std::vector<Rank> order(static_cast<std::size_t>(P));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(7);
  std::vector<Rank> best;
  double best_cost = std::numeric_limits<double>::infinity();
  for (int k = 0; k < std::max(1, starts); ++k) {
    if (k > 0)
      for (std::size_t i = order.size(); i-- > 1;) std::swap(order[i], order[static_cast<std::size_t>(rng() % (i + 1))]);
    search::State st(m, layout(m, counts, order), std::numeric_limits<std::int64_t>::max(),
                      bottleneck_weight);
    swap_descent(st);
    if (st.objective() < best_cost - 1e-6) {
      best_cost = st.objective();
      best = st.placement();
    }
  }
  return best;
}

}  // namespace cpsched::ilp
