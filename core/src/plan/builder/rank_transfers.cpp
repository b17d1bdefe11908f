// A rank's own transfers (Transfers::only): which xfers its one-stage plan
// without relays reads, and the stand-ins for the ones it does not keep.
#include <algorithm>

#include "plan/builder/internal.hpp"

namespace cpsched::plan_detail {

namespace {

std::size_t key_of(const TaskGrid& g, RowKind kind, std::size_t block, std::size_t grp) {
  return (static_cast<std::size_t>(index_of(kind)) * static_cast<std::size_t>(g.sharding().num_blocks()) + block) *
             static_cast<std::size_t>(g.num_groups()) +
         grp;
}

}  // namespace

RankKeys::RankKeys(const TaskGrid& g, const Transfers& tr, Rank only) : only_(only) {
  const auto G = static_cast<std::size_t>(g.num_groups());
  const auto nb = static_cast<std::size_t>(g.sharding().num_blocks());
  of_.assign(2 * nb * G, Of::other);
  for (std::size_t b = 0; b < nb; ++b)
    if (g.sharding().host[b] == only)
      for (RowKind kind : kRowKinds)
        for (std::size_t grp = 0; grp < G; ++grp) of_[key_of(g, kind, b, grp)] = Of::sent;
  const auto d = static_cast<std::size_t>(only);
  for (std::size_t i = tr.rank_begin[d]; i < tr.rank_begin[d + 1]; ++i) {
    const auto t = static_cast<TaskId>(tr.task_order[i]);
    const Cell& c = g.cell_of(t);
    const std::size_t grp = static_cast<std::size_t>(t) % G;
    if (g.q_host(t) != only) of_[key_of(g, RowKind::qo, static_cast<std::size_t>(c.qblock), grp)] = Of::received;
    if (g.k_host(t) != only) of_[key_of(g, RowKind::kv, static_cast<std::size_t>(c.kblock), grp)] = Of::received;
  }
}

void add_stand_ins(const TaskGrid& g, const RankKeys& keys, const std::vector<const std::vector<std::vector<Token>>*>& ends,
                   Transfers& tr) {
  const auto d = static_cast<std::size_t>(keys.only());
  std::vector<Token> all, inner;
  std::vector<Range> toggled;
  for (std::size_t x = tr.dst_begin[d]; x < tr.dst_begin[d + 1]; ++x) {
    const Xfer mine = tr.xfers[x];  // (a copy: the vector grows below)
    const std::size_t key =
        key_of(g, mine.kind, static_cast<std::size_t>(mine.block), static_cast<std::size_t>(mine.group));
    all.clear();
    for (const auto* part : ends) all.insert(all.end(), (*part)[key].begin(), (*part)[key].end());
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    // The ends strictly inside one of its ranges: those alone cut its pieces.
    inner.clear();
    auto e = all.begin();
    for (Range r : mine.rows.ranges()) {
      e = std::upper_bound(e, all.end(), r.begin);
      for (; e != all.end() && *e < r.end; ++e) inner.push_back(*e);
    }
    if (inner.empty()) continue;
    // In and out at every such end, so that each one is an end of the stand-in.
    toggled.clear();
    const Token block_end = g.sharding().blocks[static_cast<std::size_t>(mine.block)].end;
    for (std::size_t i = 0; i < inner.size(); i += 2)
      toggled.push_back({inner[i], i + 1 < inner.size() ? inner[i + 1] : block_end});
    RangeSet rows(toggled);
    const Token tokens = rows.size();
    tr.xfers.push_back(Xfer{mine.kind, mine.block, mine.group, mine.host, -1, std::move(rows), tokens});
  }
}

}  // namespace cpsched::plan_detail
