#include "instance.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

#include "kd_order.hpp"
#include "thread_pool.hpp"

namespace cpsched::bg {

namespace {

// Counting sort of tasks by chunk, per kind, keeping task order inside a chunk.
void build_chunk_lists(Instance& in) {
  const std::size_t T = in.num_tasks();
  const std::size_t NC = static_cast<std::size_t>(in.num_chunks);
  in.chunk_begin.assign(2 * NC + 1, 0);
  for (std::size_t t = 0; t < T; ++t) {
    ++in.chunk_begin[static_cast<std::size_t>(in.qchunk[t]) + 1];
    ++in.chunk_begin[NC + static_cast<std::size_t>(in.kchunk[t]) + 1];
  }
  std::partial_sum(in.chunk_begin.begin(), in.chunk_begin.end(), in.chunk_begin.begin());
  in.chunk_tasks.resize(2 * T);
  std::vector<std::int32_t> fill(in.chunk_begin.begin(), in.chunk_begin.end() - 1);
  for (std::size_t t = 0; t < T; ++t) {
    in.chunk_tasks[static_cast<std::size_t>(fill[static_cast<std::size_t>(in.qchunk[t])]++)] =
        static_cast<std::int32_t>(t);
    in.chunk_tasks[static_cast<std::size_t>(fill[NC + static_cast<std::size_t>(in.kchunk[t])]++)] =
        static_cast<std::int32_t>(t);
  }
}

// Prices every edge once. Returns the sum over blocks of the largest edge
// cost per kind (the published search starts from twice that, per group).
double build_costs(const TaskGrid& grid, const CostModel& cost, Instance& in) {
  const Problem& p = grid.problem();
  const int heads[2] = {p.q_heads_per_task(), p.kv_heads_per_task()};
  const RowKind kinds[2] = {RowKind::qo, RowKind::kv};
  const auto nb = static_cast<std::size_t>(in.nb);
  in.cost_value.assign(2 * nb, 0.0);
  in.cost_row.assign(2 * nb, -1);
  in.cost_rows.clear();
  std::vector<double> row(static_cast<std::size_t>(in.P));
  double sum_max = 0.0;
  in.min_edge_cost = std::numeric_limits<double>::infinity();
  for (int kind = 0; kind < 2; ++kind) {
    for (std::size_t b = 0; b < nb; ++b) {
      const Rank h = in.block_host[b];
      const Token len = grid.sharding().blocks[b].size();
      bool uniform = true;
      double first = -1.0, mx = 0.0;
      for (int r = 0; r < in.P; ++r) {
        if (r == h) {
          row[static_cast<std::size_t>(r)] = 0.0;
          continue;
        }
        const double c = cost.transfer(grid, kinds[kind], len, heads[kind], h, r);
        row[static_cast<std::size_t>(r)] = c;
        if (first < 0.0) first = c;
        uniform = uniform && c == first;
        mx = std::max(mx, c);
        in.min_edge_cost = std::min(in.min_edge_cost, c);
      }
      const std::size_t i = static_cast<std::size_t>(kind) * nb + b;
      in.cost_value[i] = std::max(first, 0.0);
      if (!uniform) {
        in.cost_row[i] = static_cast<std::int64_t>(in.cost_rows.size());
        in.cost_rows.insert(in.cost_rows.end(), row.begin(), row.end());
      }
      sum_max += mx;
    }
  }
  return sum_max;
}

}  // namespace

void build_instance(const TaskGrid& grid, const CostModel& cost, ThreadPool& pool, Instance& in) {
  const Sharding& sh = grid.sharding();
  in.P = grid.cp_size();
  in.G = grid.num_groups();
  in.nb = sh.num_blocks();
  in.num_chunks = in.G * in.nb;
  in.block_host = sh.host;

  const auto& cells = grid.cells();
  const std::size_t T = static_cast<std::size_t>(grid.num_tasks());
  const int G = in.G;

  // The cost model is a plugin object of unknown thread safety: call it from here only.
  std::vector<double> grid_compute(T);
  double total = 0.0;
  bool integral = true;
  for (std::size_t t = 0; t < T; ++t) {
    const double c = cost.compute(grid, static_cast<TaskId>(t));
    grid_compute[t] = c;
    total += c;
    integral = integral && c >= 0.0 && c < 0x1p53 && c == static_cast<double>(static_cast<std::int64_t>(c));
  }
  in.integral_compute = integral && total < 0x1p53;
  in.total = total;
  in.mean = in.P > 0 ? total / in.P : 0.0;
  in.threshold = 2.0 * G * build_costs(grid, cost, in);

  published_task_order(cells, G, in.nb, grid_compute, pool, in.task_of);

  in.qchunk.resize(T);
  in.kchunk.resize(T);
  in.compute.resize(T);
  in.qhost.resize(T);
  in.usp.resize(T);
  in.local.resize(T);
  // USP-affinity rank: Ulysses inside groups of w = gcd(P, G) ranks.
  const int w = std::gcd(in.P, G);
  const int groups_per_rank = G / w;
  pool.parallel_for(T, 4096, [&](int, std::size_t p0, std::size_t p1) {
    for (std::size_t pos = p0; pos < p1; ++pos) {
      const auto t = static_cast<std::size_t>(in.task_of[pos]);
      const Cell& cell = cells[t / static_cast<std::size_t>(G)];
      const int g = static_cast<int>(t % static_cast<std::size_t>(G));
      const Rank qh = sh.host[static_cast<std::size_t>(cell.qblock)];
      const Rank kh = sh.host[static_cast<std::size_t>(cell.kblock)];
      in.qchunk[pos] = g * in.nb + cell.qblock;
      in.kchunk[pos] = g * in.nb + cell.kblock;
      in.compute[pos] = grid_compute[t];
      in.qhost[pos] = qh;
      in.local[pos] = qh == kh ? 1 : 0;
      in.usp[pos] = (qh / w) * w + g / groups_per_rank;
    }
  });
  build_chunk_lists(in);
}

}  // namespace cpsched::bg
