#include "dispatch.hpp"

#include <algorithm>
#include <numeric>

namespace cpsched::static_solver {

std::vector<Rank> deal_chunks(const std::vector<Token>& areas, int P) {
  const std::size_t n = areas.size();
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return areas[a] > areas[b]; });

  const std::size_t base = n / static_cast<std::size_t>(P);
  std::size_t extra_left = n % static_cast<std::size_t>(P);  // ranks that may still take base + 1
  std::vector<Token> load(static_cast<std::size_t>(P), 0);
  std::vector<std::size_t> count(static_cast<std::size_t>(P), 0);
  std::vector<Rank> host(n, 0);
  for (const std::size_t c : order) {
    Rank best = -1;
    for (Rank r = 0; r < P; ++r) {
      const std::size_t k = count[static_cast<std::size_t>(r)];
      const bool room = k < base || (k == base && extra_left > 0);
      if (room && (best < 0 || load[static_cast<std::size_t>(r)] < load[static_cast<std::size_t>(best)])) best = r;
    }
    if (count[static_cast<std::size_t>(best)] == base) --extra_left;
    ++count[static_cast<std::size_t>(best)];
    load[static_cast<std::size_t>(best)] += areas[c];
    host[c] = best;
  }
  return host;
}

std::vector<Rank> deal_chunks_by_node(const std::vector<Token>& areas, Token chunk, Token node_chunk, int P,
                                      int node_ranks) {
  const int nodes = P / node_ranks;
  const auto per = static_cast<std::size_t>(node_chunk / chunk);  // chunks per node chunk
  const std::size_t n = areas.size();
  const std::size_t m = (n + per - 1) / per;
  std::vector<Token> node_area(m, 0);
  for (std::size_t i = 0; i < n; ++i) node_area[i / per] += areas[i];
  const std::vector<Rank> node_of = deal_chunks(node_area, nodes);
  std::vector<Rank> host(n, 0);
  for (int node = 0; node < nodes; ++node) {
    std::vector<std::size_t> mine;
    for (std::size_t i = 0; i < n; ++i)
      if (node_of[i / per] == node) mine.push_back(i);
    std::vector<Token> a(mine.size());
    for (std::size_t k = 0; k < mine.size(); ++k) a[k] = areas[mine[k]];
    const std::vector<Rank> local = deal_chunks(a, std::min<int>(node_ranks, static_cast<int>(std::max<std::size_t>(mine.size(), 1))));
    for (std::size_t k = 0; k < mine.size(); ++k) host[mine[k]] = node * node_ranks + local[k];
  }
  return host;
}

Sharding dispatched_sharding(Token S, Token chunk, const std::vector<Rank>& host, int P) {
  std::vector<Range> blocks;
  std::vector<Rank> owner;
  for (std::size_t i = 0; i < host.size(); ++i) {
    const Range r{static_cast<Token>(i) * chunk, std::min(static_cast<Token>(i + 1) * chunk, S)};
    if (!blocks.empty() && owner.back() == host[i]) {
      blocks.back().end = r.end;
    } else {
      blocks.push_back(r);
      owner.push_back(host[i]);
    }
  }
  return Sharding::dispatched(P, std::move(blocks), std::move(owner));
}

}  // namespace cpsched::static_solver
