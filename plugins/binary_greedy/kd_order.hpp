#pragma once
// The order in which the published implementation lists the grid's tasks.
//
// It flattens head groups group-major (chunk c = g * nb + b) and enumerates
// the non-empty cells of the (chunks x chunks) grid by a kd-style recursion:
// split the q range at half (n / 2), then the k range, alternating, a
// dimension of one chunk no longer split. Stage 2 sorts tasks stably by
// (degree, area), so this order decides every tie; it is reproduced here
// through a per-leaf key instead of the recursion.
#include <cstdint>
#include <vector>

#include <cpsched/problem/task_grid.hpp>

namespace cpsched::bg {

class ThreadPool;

// Key of the leaf (qc, kc) in an (m x n) recursion: comparing keys as
// unsigned integers gives the recursion's leaf order.
class KdKeys {
 public:
  KdKeys(int m, int n);
  std::uint64_t key(int qc, int kc) const;

 private:
  struct Path {
    std::uint32_t bits = 0;  // the left/right choices, first choice most significant
    int len = 0;
  };
  static std::vector<Path> paths(int n);
  std::vector<Path> q_, k_;
};

// Grid task ids (t = cell * G + g) sorted by (compute descending, published
// order). `compute` is per grid task.
void published_task_order(const std::vector<Cell>& cells, int G, int nb, const std::vector<double>& compute,
                          ThreadPool& pool, std::vector<std::int32_t>& out);

// The same order by the generic path only (every task keyed on the full
// chunk grid); published_task_order takes a shortcut when it may.
void published_task_order_generic(const std::vector<Cell>& cells, int G, int nb, const std::vector<double>& compute,
                                  ThreadPool& pool, std::vector<std::int32_t>& out);

}  // namespace cpsched::bg
