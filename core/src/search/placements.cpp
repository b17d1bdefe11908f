#include "cpsched/search/placements.hpp"

#include <algorithm>
#include <cmath>

#include <cpsched/problem/metrics.hpp>
#include <cpsched/hardware/node_map.hpp>

namespace cpsched::search {

namespace {

// usp's rank of head group g of a q block hosted by h (Ulysses groups of u
// ranks, G head groups).
Rank usp_rank(Rank h, int g, int u, int G) { return (h / u) * u + g * u / G; }

}  // namespace

std::vector<Rank> owner_placement(const TaskGrid& grid) {
  std::vector<Rank> r(static_cast<std::size_t>(grid.num_tasks()));
  for (TaskId t = 0; t < grid.num_tasks(); ++t) r[static_cast<std::size_t>(t)] = grid.q_host(t);
  return r;
}

std::vector<Rank> usp_placement(const TaskGrid& grid, int max_degree) {
  if (!grid.flattened()) return {};
  const int P = grid.cp_size(), G = grid.num_groups();
  const int u = usp_ulysses_degree(P, grid.problem().heads.kv, max_degree);
  std::vector<Rank> r(static_cast<std::size_t>(grid.num_tasks()));
  for (TaskId t = 0; t < grid.num_tasks(); ++t)
    r[static_cast<std::size_t>(t)] = usp_rank(grid.q_host(t), grid.group_of(t), u, G);
  return r;
}

std::vector<Rank> hybrid_placement(const TaskGrid& grid, int max_degree, const double byte_s[2], int gpus_per_node) {
  if (!grid.flattened()) return {};
  const Problem& p = grid.problem();
  const int P = grid.cp_size(), G = grid.num_groups();
  const int u = usp_ulysses_degree(P, p.heads.kv, max_degree);
  const TransferBytes fb = fwd_bytes_per_token(p), bb = bwd_bytes_per_token(p);
  const auto qo = static_cast<double>(fb.qo_out + fb.qo_back + bb.qo_out + bb.qo_back);
  const auto kv = static_cast<double>(fb.kv_out + fb.kv_back + bb.kv_out + bb.kv_back);
  const NodeMap nodes{std::max(1, gpus_per_node)};
  auto secs = [&](Rank a, Rank b) { return byte_s[nodes.link_index(a, b)]; };
  const auto& cells = grid.cells();
  const auto& sh = grid.sharding();
  std::vector<Rank> r = owner_placement(grid);
  std::vector<double> spread(static_cast<std::size_t>(G));
  for (std::size_t c0 = 0; c0 < cells.size();) {
    const std::int32_t qb = cells[c0].qblock;
    std::size_t c1 = c0;
    while (c1 < cells.size() && cells[c1].qblock == qb) ++c1;
    const Rank h = sh.host[static_cast<std::size_t>(qb)];
    const auto rows = static_cast<double>(sh.blocks[static_cast<std::size_t>(qb)].size());
    double owner = 0;
    for (int g = 0; g < G; ++g) {
      const Rank to = usp_rank(h, g, u, G);
      spread[static_cast<std::size_t>(g)] = to == h ? 0.0 : rows * qo * secs(h, to);
    }
    for (std::size_t c = c0; c < c1; ++c) {
      const Rank kh = sh.host[static_cast<std::size_t>(cells[c].kblock)];
      const auto cols = static_cast<double>(cells[c].cols.size());
      if (kh != h) owner += G * cols * kv * secs(kh, h);
      for (int g = 0; g < G; ++g) {
        const Rank to = usp_rank(h, g, u, G);
        if (kh != to) spread[static_cast<std::size_t>(g)] += cols * kv * secs(kh, to);
      }
    }
    if (*std::max_element(spread.begin(), spread.end()) < owner)
      for (std::size_t c = c0; c < c1; ++c)
        for (int g = 0; g < G; ++g)
          r[c * static_cast<std::size_t>(G) + static_cast<std::size_t>(g)] = usp_rank(h, g, u, G);
    c0 = c1;
  }
  return r;
}

std::int64_t balance_cap(const TaskGrid& grid, double mu) {
  // imbalance = max load x P / total <= mu (computed as compute_metrics does,
  // so that a load at the cap never reads as imbalance > mu).
  const std::int64_t total_load = grid.total_load();  // the sum of the tasks' loads
  const double total = static_cast<double>(total_load);
  const double P = grid.cp_size();
  if (total <= 0) return 0;
  // A cap at or above the whole load constrains nothing (and mu x total / P
  // may not even fit in 64 bits: mu = 1e12 once made this count up forever).
  if (!(mu * total / P < total)) return total_load;
  auto ok = [&](std::int64_t c) { return static_cast<double>(c) * P / total <= mu; };
  auto cap = static_cast<std::int64_t>(std::floor(mu * total / P));
  // Rounding moves the answer by a few units at most.
  for (int i = 0; i < 64 && cap > 0 && !ok(cap); ++i) --cap;
  for (int i = 0; i < 64 && cap < total_load && ok(cap + 1); ++i) ++cap;
  return cap;
}

}  // namespace cpsched::search
