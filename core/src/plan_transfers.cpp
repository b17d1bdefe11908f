// Which rows travel where (token-granular transfers), and in which stage.
#include <algorithm>
#include <numeric>
#include <tuple>

#include "plan_builder_internal.hpp"

namespace cpsched::plan_detail {

std::vector<Token> block_local_offsets(const Sharding& sh) {
  std::vector<Token> fill(static_cast<std::size_t>(sh.cp_size), 0);
  std::vector<Token> off(sh.blocks.size());
  for (std::size_t b = 0; b < sh.blocks.size(); ++b) {
    Token& f = fill[static_cast<std::size_t>(sh.host[b])];
    off[b] = f;
    f += sh.blocks[b].size();
  }
  return off;
}

Transfers collect_transfers(const Assignment& a) {
  const TaskGrid& g = *a.grid;
  const auto P = static_cast<std::size_t>(g.cp_size());
  const auto T = static_cast<std::size_t>(g.num_tasks());
  const auto G = static_cast<std::size_t>(g.num_groups());
  const auto nb = static_cast<std::size_t>(g.sharding().num_blocks());
  Transfers tr;

  // Tasks by computing rank (counting sort keeps task order inside a rank).
  tr.rank_begin.assign(P + 1, 0);
  for (Rank r : a.rank) ++tr.rank_begin[static_cast<std::size_t>(r) + 1];
  std::partial_sum(tr.rank_begin.begin(), tr.rank_begin.end(), tr.rank_begin.begin());
  tr.task_order.resize(T);
  {
    std::vector<std::size_t> fill(tr.rank_begin.begin(), tr.rank_begin.end() - 1);
    for (std::size_t t = 0; t < T; ++t)
      tr.task_order[fill[static_cast<std::size_t>(a.rank[t])]++] = static_cast<std::int32_t>(t);
  }

  // One xfer per (kind, block, group) and dst. Ranks are visited in order, so a
  // slot stamped with the current rank already holds that rank's xfer.
  std::vector<std::int32_t> slot(2 * nb * G, -1);
  std::vector<Rank> stamp(2 * nb * G, -1);
  tr.task_q.assign(T, -1);
  tr.task_k.assign(T, -1);
  tr.dst_begin.assign(P + 1, 0);
  // Rows of each xfer come from its tasks' cells out of token order (KV cols
  // by q block): collected and merged once per xfer.
  std::vector<RangeSet::Builder> rows;
  auto xfer_for = [&](std::uint8_t kind, std::int32_t block, std::size_t grp, Rank d) {
    const std::size_t key = (kind * nb + static_cast<std::size_t>(block)) * G + grp;
    if (stamp[key] != d) {
      stamp[key] = d;
      slot[key] = static_cast<std::int32_t>(tr.xfers.size());
      tr.xfers.push_back(Xfer{kind, block, static_cast<std::int32_t>(grp),
                              g.sharding().host[static_cast<std::size_t>(block)], d, {}});
      rows.emplace_back();
    }
    return slot[key];
  };
  for (std::size_t d = 0; d < P; ++d) {
    tr.dst_begin[d] = tr.xfers.size();
    for (std::size_t i = tr.rank_begin[d]; i < tr.rank_begin[d + 1]; ++i) {
      const auto t = static_cast<TaskId>(tr.task_order[i]);
      const Cell& c = g.cell_of(t);
      const std::size_t grp = static_cast<std::size_t>(t) % G;
      const auto rank = static_cast<Rank>(d);
      if (g.q_host(t) != rank) {
        const std::int32_t x = xfer_for(kQO, c.qblock, grp, rank);
        rows[static_cast<std::size_t>(x)].add(c.rows);
        tr.task_q[static_cast<std::size_t>(t)] = x;
      }
      if (g.k_host(t) != rank) {
        const std::int32_t x = xfer_for(kKV, c.kblock, grp, rank);
        rows[static_cast<std::size_t>(x)].add(c.cols);
        tr.task_k[static_cast<std::size_t>(t)] = x;
      }
    }
  }
  tr.dst_begin[P] = tr.xfers.size();
  for (std::size_t i = 0; i < tr.xfers.size(); ++i) {
    tr.xfers[i].rows = rows[i].build();
    tr.xfers[i].tokens = tr.xfers[i].rows.size();
  }
  return tr;
}

std::vector<int> assign_stages(const Transfers& tr, Bytes qo_out, Bytes kv_out, int stages) {
  std::vector<int> stage(tr.xfers.size(), 1);
  if (stages <= 1) return stage;
  struct Key {
    Bytes bytes;
    Rank host;
    std::uint8_t kind;
    std::int32_t block, group;
    std::size_t id;
    auto tie() const { return std::tie(bytes, host, kind, block, group); }
  };
  std::vector<Key> keys;
  for (std::size_t d = 0; d + 1 < tr.dst_begin.size(); ++d) {
    keys.clear();
    Bytes total = 0;
    for (std::size_t i = tr.dst_begin[d]; i < tr.dst_begin[d + 1]; ++i) {
      const Xfer& x = tr.xfers[i];
      keys.push_back({x.tokens * (x.kind == kQO ? qo_out : kv_out), x.host, x.kind, x.block, x.group, i});
      total += keys.back().bytes;
    }
    std::sort(keys.begin(), keys.end(), [](const Key& l, const Key& r) { return l.tie() < r.tie(); });
    // Stage 1 + floor(N * before / total), exact in 128-bit integers.
    Bytes before = 0;
    for (const Key& k : keys) {
      const __int128 s = total > 0 ? static_cast<__int128>(before) * stages / total : 0;
      stage[k.id] = 1 + static_cast<int>(std::min<__int128>(stages - 1, s));
      before += k.bytes;
    }
  }
  return stage;
}

}  // namespace cpsched::plan_detail
