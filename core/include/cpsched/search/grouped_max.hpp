#pragma once
// The largest of P values kept per group of consecutive ranks (a node): a
// tournament tree over the groups' maxima, each group scanned when one of its
// values changes. It answers "the largest value outside these groups and
// ranks" in O((skipped groups + 1) log groups + group size x groups with a
// skipped rank), where a tree over ranks walked past every rank of the
// skipped groups (State's coupled step with relays skips whole nodes).
#include <algorithm>
#include <cstddef>
#include <functional>
#include <vector>

#include "cpsched/search/rank_tree.hpp"

namespace cpsched::search {

class GroupedMax {
 public:
  // Groups of `group` ranks ([k group, (k + 1) group)); the last may be short.
  void reset(const std::vector<double>& values, int group) {
    v_ = values;
    g_ = group < 1 ? 1 : group;
    const std::size_t n = (v_.size() + static_cast<std::size_t>(g_) - 1) / static_cast<std::size_t>(g_);
    best_in_.assign(n, -1);
    std::vector<double> m(n, 0.0);
    for (std::size_t k = 0; k < n; ++k) {
      best_in_[k] = scan(k);
      m[k] = v_[static_cast<std::size_t>(best_in_[k])];
    }
    tree_.reset(m);
  }
  void set(int r, double x) {
    v_[static_cast<std::size_t>(r)] = x;
    const auto k = static_cast<std::size_t>(r / g_);
    best_in_[k] = scan(k);
    tree_.set(static_cast<int>(k), v_[static_cast<std::size_t>(best_in_[k])]);
  }
  double value(int r) const { return v_[static_cast<std::size_t>(r)]; }
  // The largest value (0 when empty).
  double max() const { return v_.empty() ? 0.0 : v_[static_cast<std::size_t>(best_in_[static_cast<std::size_t>(tree_.best())])]; }
  // The largest value of a rank r with neither skip_group(r / group) nor
  // skip_rank(r) (0 when none).
  template <class SkipGroup, class SkipRank>
  double max_unless(SkipGroup&& skip_group, SkipRank&& skip_rank) const {
    bool found = false;
    double best = 0.0;
    // Groups come in decreasing order of their maxima: the first one without a
    // skipped rank ends the walk, as does one whose maximum cannot beat a
    // value found in an earlier group.
    tree_.best_unless([&](int k) {
      const double top = v_[static_cast<std::size_t>(best_in_[static_cast<std::size_t>(k)])];
      if (found && top <= best) return false;
      if (skip_group(k)) return true;
      const int r0 = k * g_, r1 = std::min(static_cast<int>(v_.size()), r0 + g_);
      bool clean = true;
      for (int r = r0; r < r1; ++r) {
        if (skip_rank(r)) {
          clean = false;
          continue;
        }
        const double x = v_[static_cast<std::size_t>(r)];
        if (!found || x > best) best = x, found = true;
      }
      return !clean;  // a group without a skipped rank holds the answer
    });
    return best;
  }

 private:
  int scan(std::size_t k) const {
    const int r0 = static_cast<int>(k) * g_, r1 = std::min(static_cast<int>(v_.size()), r0 + g_);
    int b = r0;
    for (int r = r0 + 1; r < r1; ++r)
      if (v_[static_cast<std::size_t>(r)] > v_[static_cast<std::size_t>(b)]) b = r;
    return b;
  }
  std::vector<double> v_;
  int g_ = 1;
  std::vector<int> best_in_;  // per group: its rank of the largest value (lowest on ties)
  RankTree<double, std::greater<>> tree_;
};

}  // namespace cpsched::search
