#pragma once
// A tournament tree over the P ranks: one value per rank, the best ranks in
// O(log P) after a change (State keeps the least loaded rank and the ranks of
// the largest times with it; a full scan per move made P = 4096 quadratic).
// `Better(a, b)`: a's value ranks before b's; ties go to the lower rank.
#include <cstddef>
#include <algorithm>
#include <vector>

namespace cpsched::search {

template <class T, class Better>
class RankTree {
 public:
  void reset(const std::vector<T>& values) {
    n_ = values.size();
    size_ = 1;
    while (size_ < n_) size_ *= 2;
    val_ = values;
    win_.assign(2 * size_, -1);
    for (std::size_t i = 0; i < n_; ++i) win_[size_ + i] = static_cast<int>(i);
    for (std::size_t i = size_ - 1; i >= 1; --i) win_[i] = pick(win_[2 * i], win_[2 * i + 1]);
  }
  void set(int r, T v) {
    val_[static_cast<std::size_t>(r)] = v;
    for (std::size_t i = (size_ + static_cast<std::size_t>(r)) / 2; i >= 1; i /= 2) win_[i] = pick(win_[2 * i], win_[2 * i + 1]);
  }
  // The best rank (-1 when empty).
  int best() const { return n_ == 0 ? -1 : win_[1]; }
  // The best rank for which skip(rank) is false (-1 when none): the same
  // best-first walk as top(), stopped at the first rank not skipped, so
  // O((skipped + 1) log P).
  template <class Skip>
  int best_unless(Skip&& skip) const {
    if (n_ == 0) return -1;
    auto worse = [&](std::size_t x, std::size_t y) { return pick(win_[x], win_[y]) == win_[y] && win_[x] != win_[y]; };
    open_.clear();
    open_.push_back(1);
    while (!open_.empty()) {
      std::pop_heap(open_.begin(), open_.end(), worse);
      const std::size_t node = open_.back();
      open_.pop_back();
      if (node >= size_) {
        if (!skip(win_[node])) return win_[node];
        continue;
      }
      for (std::size_t c : {2 * node, 2 * node + 1}) {
        if (win_[c] < 0) continue;
        open_.push_back(c);
        std::push_heap(open_.begin(), open_.end(), worse);
      }
    }
    return -1;
  }
  // The k best ranks, best first (best-first walk of the tree: O(k log P);
  // the walk's heap is kept between calls, so a move allocates nothing).
  void top(std::size_t k, std::vector<int>& out) const {
    out.clear();
    if (n_ == 0) return;
    // Heap order: the node whose winner ranks first on top.
    auto worse = [&](std::size_t x, std::size_t y) { return pick(win_[x], win_[y]) == win_[y] && win_[x] != win_[y]; };
    open_.clear();
    open_.push_back(1);
    while (!open_.empty() && out.size() < k) {
      std::pop_heap(open_.begin(), open_.end(), worse);
      std::size_t node = open_.back();
      open_.pop_back();
      // The node's winner is next. Down its path to its leaf, each level's
      // other child holds the next candidates of that subtree (the path's
      // own nodes would only be popped again for the same winner).
      const int w = win_[node];
      while (node < size_) {
        const std::size_t on = win_[2 * node] == w ? 2 * node : 2 * node + 1;
        const std::size_t off = on ^ 1U;
        if (win_[off] >= 0) {
          open_.push_back(off);
          std::push_heap(open_.begin(), open_.end(), worse);
        }
        node = on;
      }
      out.push_back(w);
    }
  }

 private:
  int pick(int a, int b) const {
    if (a < 0) return b;
    if (b < 0) return a;
    const T& va = val_[static_cast<std::size_t>(a)];
    const T& vb = val_[static_cast<std::size_t>(b)];
    if (Better{}(va, vb)) return a;
    if (Better{}(vb, va)) return b;
    return a < b ? a : b;
  }
  std::size_t n_ = 0, size_ = 1;
  std::vector<T> val_;
  std::vector<int> win_;  // [1, 2 size): winner rank of each node; leaves at size_ + r
  mutable std::vector<std::size_t> open_;  // top()'s scratch heap
};

}  // namespace cpsched::search
