// Which rows travel where (token-granular transfers), and in which stage.
#include <algorithm>
#include <array>
#include <iterator>
#include <numeric>
#include <optional>
#include <span>
#include <tuple>

#include "mask/index/internal.hpp"
#include "plan/builder/internal.hpp"

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

int threads_for(std::size_t work, std::size_t per_thread) {
  return static_cast<int>(std::clamp<std::size_t>(work / per_thread, 1,
                                                  static_cast<std::size_t>(index_detail::resolve_threads(0))));
}

namespace {

// The xfers of the receivers [d0, d1), numbered from 0 in receiver order: what
// collect_transfers does for all of them, for one thread's share.
struct XferPart {
  std::vector<Xfer> xfers;
  std::vector<std::size_t> dst_begin;  // per receiver of the part, local numbering
  std::array<std::vector<Token>, 2> sent;  // tokens per kind and host, of the part's receivers
  bool remote_q = false, remote_k = false;
  std::vector<std::vector<Token>> ends;  // per key, rank-only: the other receivers' range ends (RankKeys)
};

// keep (null: keep all): which xfers are kept (RankKeys). The tokens of every
// xfer are counted.
XferPart collect_part(const TaskGrid& g, const Transfers& tr, std::size_t d0, std::size_t d1, const RankKeys* keep,
                      std::vector<std::int32_t>& task_q, std::vector<std::int32_t>& task_k,
                      std::array<std::vector<Token>, 2>& received) {
  const auto G = static_cast<std::size_t>(g.num_groups());
  const auto nb = static_cast<std::size_t>(g.sharding().num_blocks());
  const auto P = static_cast<std::size_t>(g.cp_size());
  XferPart part;
  part.dst_begin.reserve(d1 - d0);
  for (auto& s : part.sent) s.assign(P, 0);
  if (keep != nullptr) part.ends.resize(2 * nb * G);
  std::vector<const RangeSet*> ends_of(keep != nullptr ? 2 * nb * G : 0, nullptr);  // the set whose ends came last
  // One xfer per (kind, block, group) and dst. Ranks are visited in order, so a
  // key stamped with the current rank already has its open xfer.
  std::vector<std::int32_t> slot(2 * nb * G, -1);
  std::vector<Rank> stamp(2 * nb * G, -1);
  // The current receiver's xfers. Their rows come from their tasks' cells out
  // of token order (KV cols by q block), but the many tasks of one xfer mostly
  // need equal rows (one causal kv block: the whole block, from every q
  // block): a set equal to the one given last is not added again, and the
  // rows are merged only when a second one differs.
  struct Open {
    RowKind kind;
    std::int32_t block, group;
    std::size_t key;
    std::int32_t x;  // its index in part.xfers, -1 when only counted
    bool ends;       // rank-only: its range ends cut the kept rank's rows
    const RangeSet* first;
    const RangeSet* last;
    std::int32_t more;  // its builder in `builders` once a second set came, else -1
  };
  std::vector<Open> open;
  std::vector<RangeSet::Builder> builders;  // reused from receiver to receiver
  std::size_t used = 0;
  auto add = [&](Open& o, const RangeSet& s) {
    if (o.last == &s || *o.last == s) return;
    if (o.more < 0) {
      if (used == builders.size()) builders.emplace_back();
      o.more = static_cast<std::int32_t>(used++);
      builders[static_cast<std::size_t>(o.more)].add(*o.first);
    }
    builders[static_cast<std::size_t>(o.more)].add(s);
    o.last = &s;
  };
  auto open_for = [&](RowKind kind, std::int32_t block, std::size_t grp, Rank d, const RangeSet& s) {
    const std::size_t key = (static_cast<std::size_t>(index_of(kind)) * nb + static_cast<std::size_t>(block)) * G + grp;
    if (stamp[key] == d) {
      Open& o = open[static_cast<std::size_t>(slot[key])];
      add(o, s);
      return o.x;
    }
    stamp[key] = d;
    slot[key] = static_cast<std::int32_t>(open.size());
    const RankKeys::Use use = keep == nullptr ? RankKeys::all : keep->use(key, d);
    std::int32_t x = -1;
    if (use == RankKeys::all) {
      x = static_cast<std::int32_t>(part.xfers.size());
      part.xfers.push_back(Xfer{kind, block, static_cast<std::int32_t>(grp),
                                g.sharding().host[static_cast<std::size_t>(block)], d, {}});
    }
    open.push_back({kind, block, static_cast<std::int32_t>(grp), key, x, use == RankKeys::ends, &s, &s, -1});
    return x;
  };
  for (std::size_t d = d0; d < d1; ++d) {
    part.dst_begin.push_back(part.xfers.size());
    const auto rank = static_cast<Rank>(d);
    open.clear();
    used = 0;
    for (std::size_t i = tr.rank_begin[d]; i < tr.rank_begin[d + 1]; ++i) {
      const auto t = static_cast<TaskId>(tr.task_order[i]);
      const Cell& c = g.cell_of(t);
      const std::size_t grp = static_cast<std::size_t>(t) % G;
      if (g.q_host(t) != rank) {
        part.remote_q = true;
        task_q[static_cast<std::size_t>(t)] = open_for(RowKind::qo, c.qblock, grp, rank, c.rows);
      }
      if (g.k_host(t) != rank) {
        part.remote_k = true;
        task_k[static_cast<std::size_t>(t)] = open_for(RowKind::kv, c.kblock, grp, rank, c.cols);
      }
    }
    for (Open& o : open) {
      RangeSet merged;
      if (o.more >= 0) merged = builders[static_cast<std::size_t>(o.more)].build();
      const RangeSet& rows = o.more >= 0 ? merged : *o.first;
      const Token tokens = rows.size();
      const auto k = static_cast<std::size_t>(index_of(o.kind));
      part.sent[k][static_cast<std::size_t>(g.sharding().host[static_cast<std::size_t>(o.block)])] += tokens;
      received[k][d] += tokens;
      if (o.ends) {
        // The ends of a cell's set equal to the one before are there already.
        const RangeSet*& last = ends_of[o.key];
        if (o.more >= 0 || last == nullptr || !(last == o.first || *last == *o.first)) {
          for (Range r : rows.ranges()) part.ends[o.key].insert(part.ends[o.key].end(), {r.begin, r.end});
          last = o.more >= 0 ? nullptr : o.first;
        }
      }
      if (o.x < 0) continue;
      Xfer& xf = part.xfers[static_cast<std::size_t>(o.x)];
      xf.rows = o.more >= 0 ? std::move(merged) : *o.first;
      xf.tokens = tokens;
    }
  }
  return part;
}

}  // namespace

Transfers collect_transfers(const Assignment& a, int threads, Rank only) {
  const TaskGrid& g = *a.grid;
  const auto P = static_cast<std::size_t>(g.cp_size());
  const auto T = static_cast<std::size_t>(g.num_tasks());
  Transfers tr;
  tr.only = only;

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
  tr.task_q.assign(T, -1);
  tr.task_k.assign(T, -1);
  for (auto& v : tr.tokens.received) v.assign(P, 0);
  std::optional<RankKeys> keep;
  if (only >= 0) keep = RankKeys(g, tr, only);

  // Receivers in contiguous runs of about equal task counts, one per thread
  // (one per million tasks unless given); each numbers its xfers from 0, and
  // the runs are joined in receiver order, so the xfers are the same at any
  // thread count.
  const int W = std::clamp(threads > 0 ? threads : threads_for(T, std::size_t{1} << 20), 1, static_cast<int>(P));
  std::vector<std::size_t> cut(static_cast<std::size_t>(W) + 1, P);
  cut[0] = 0;
  for (std::size_t w = 1; w < cut.size() - 1; ++w)  // nondecreasing in w, at most P (the want is below T)
    cut[w] = static_cast<std::size_t>(
        std::lower_bound(tr.rank_begin.begin(), tr.rank_begin.end(), T * w / static_cast<std::size_t>(W)) -
        tr.rank_begin.begin());
  std::vector<XferPart> parts(static_cast<std::size_t>(W));
  index_detail::run_threads(W, [&](int w) {
    const auto i = static_cast<std::size_t>(w);
    parts[i] = collect_part(g, tr, cut[i], cut[i + 1], keep ? &*keep : nullptr, tr.task_q, tr.task_k,
                            tr.tokens.received);
  });

  tr.dst_begin.assign(P + 1, 0);
  std::vector<std::int32_t> base(static_cast<std::size_t>(W), 0);
  std::size_t total = 0;
  for (auto& v : tr.tokens.sent) v.assign(P, 0);
  for (int w = 0; w < W; ++w) {
    const XferPart& part = parts[static_cast<std::size_t>(w)];
    base[static_cast<std::size_t>(w)] = static_cast<std::int32_t>(total);
    total += part.xfers.size();
    for (std::size_t k = 0; k < 2; ++k)
      for (std::size_t r = 0; r < P; ++r) tr.tokens.sent[k][r] += part.sent[k][r];
    tr.remote_q |= part.remote_q;
    tr.remote_k |= part.remote_k;
  }
  tr.xfers.reserve(total);
  for (int w = 0; w < W; ++w) {
    const auto i = static_cast<std::size_t>(w);
    for (std::size_t d = cut[i]; d < cut[i + 1]; ++d)
      tr.dst_begin[d] = static_cast<std::size_t>(base[i]) + parts[i].dst_begin[d - cut[i]];
    std::move(parts[i].xfers.begin(), parts[i].xfers.end(), std::back_inserter(tr.xfers));
  }
  tr.dst_begin[P] = total;
  if (keep) {
    std::vector<const std::vector<std::vector<Token>>*> of_parts;
    for (const XferPart& part : parts) of_parts.push_back(&part.ends);
    add_stand_ins(g, *keep, of_parts, tr);
  }
  // The later parts' tasks point at their part's xfers: shift them to the joined numbering.
  if (W > 1)
    index_detail::run_threads(W, [&](int w) {
      const auto i = static_cast<std::size_t>(w);
      const std::int32_t b = base[i];
      if (b == 0) return;
      for (std::size_t k = tr.rank_begin[cut[i]]; k < tr.rank_begin[cut[i + 1]]; ++k) {
        const auto t = static_cast<std::size_t>(tr.task_order[k]);
        if (tr.task_q[t] >= 0) tr.task_q[t] += b;
        if (tr.task_k[t] >= 0) tr.task_k[t] += b;
      }
    });
  return tr;
}

SendOrder send_order(const Assignment& a, const Transfers& tr, Bytes qo_out, Bytes kv_out) {
  const TaskGrid& g = *a.grid;
  SendOrder out;
  out.qo_out = qo_out;
  out.kv_out = kv_out;
  out.seq.reserve(tr.xfers.size());
  auto bytes_of = [&](std::size_t i) {
    const Xfer& x = tr.xfers[i];
    return x.tokens * (x.kind == RowKind::qo ? qo_out : kv_out);
  };
  std::vector<double> enabled(tr.xfers.size(), 0.0);  // load of the tasks that need each xfer
  // The sort's keys side by side (the comparator reads no other memory).
  struct Key {
    Bytes bytes;
    double enabled;
    Rank host;
    RowKind kind;
    std::int32_t block, group;
    std::size_t i;
  };
  std::vector<Key> order;
  std::vector<std::size_t> pos(tr.xfers.size(), 0);
  std::vector<std::size_t> bucket;        // walk's counting sort: tasks per last-transfer position
  std::vector<std::int32_t> walk;         // tasks in the order of their last transfer
  std::vector<char> sent;
  for (std::size_t d = 0; d + 1 < tr.dst_begin.size(); ++d) {
    const std::size_t x0 = tr.dst_begin[d], x1 = tr.dst_begin[d + 1];
    if (x0 == x1) continue;
    const std::span<const std::int32_t> tasks(tr.task_order.data() + tr.rank_begin[d],
                                              tr.rank_begin[d + 1] - tr.rank_begin[d]);
    for (std::int32_t t : tasks) {
      const auto load = static_cast<double>(g.load(t));
      for (std::int32_t x : {tr.task_q[static_cast<std::size_t>(t)], tr.task_k[static_cast<std::size_t>(t)]})
        if (x >= 0) enabled[static_cast<std::size_t>(x)] += load;
    }
    // Transfers by bytes per unit of work they unlock, cheapest first (ties
    // as before: bytes, source, kind, block, group).
    order.clear();
    for (std::size_t i = x0; i < x1; ++i) {
      const Xfer& x = tr.xfers[i];
      order.push_back({bytes_of(i), enabled[i], x.host, x.kind, x.block, x.group, i});
    }
    std::sort(order.begin(), order.end(), [](const Key& l, const Key& r) {
      // bytes_l / enabled_l < bytes_r / enabled_r, without dividing by zero
      const double lhs = static_cast<double>(l.bytes) * r.enabled;
      const double rhs = static_cast<double>(r.bytes) * l.enabled;
      if (lhs != rhs) return lhs < rhs;
      return std::tie(l.bytes, l.host, l.kind, l.block, l.group, l.i) <
             std::tie(r.bytes, r.host, r.kind, r.block, r.group, r.i);
    });
    for (std::size_t k = 0; k < order.size(); ++k) pos[order[k].i] = k;
    // Tasks in the order in which their last transfer comes (ties in task
    // order: a stable counting sort); walking them sends each transfer with
    // the first task that needs it, so the two transfers of a task travel
    // together.
    auto last_of = [&](std::int32_t t) {
      const std::int32_t q = tr.task_q[static_cast<std::size_t>(t)], k = tr.task_k[static_cast<std::size_t>(t)];
      std::size_t kk = 0;
      if (q >= 0) kk = std::max(kk, pos[static_cast<std::size_t>(q)]);
      if (k >= 0) kk = std::max(kk, pos[static_cast<std::size_t>(k)]);
      return kk;
    };
    bucket.assign(order.size() + 1, 0);
    std::size_t remote = 0;
    for (std::int32_t t : tasks)
      if (tr.task_q[static_cast<std::size_t>(t)] >= 0 || tr.task_k[static_cast<std::size_t>(t)] >= 0)
        ++bucket[last_of(t) + 1], ++remote;
    for (std::size_t k = 1; k < bucket.size(); ++k) bucket[k] += bucket[k - 1];
    walk.resize(remote);
    for (std::int32_t t : tasks)
      if (tr.task_q[static_cast<std::size_t>(t)] >= 0 || tr.task_k[static_cast<std::size_t>(t)] >= 0)
        walk[bucket[last_of(t)]++] = t;
    sent.assign(x1 - x0, 0);
    auto send = [&](std::int32_t x) {
      if (x < 0 || sent[static_cast<std::size_t>(x) - x0]) return;
      sent[static_cast<std::size_t>(x) - x0] = 1;
      out.seq.push_back(x);
    };
    for (std::int32_t t : walk) {
      const std::int32_t q = tr.task_q[static_cast<std::size_t>(t)], k = tr.task_k[static_cast<std::size_t>(t)];
      // The cheaper-per-work transfer first (the one the order puts first).
      if (q >= 0 && k >= 0 && pos[static_cast<std::size_t>(k)] < pos[static_cast<std::size_t>(q)]) {
        send(k);
        send(q);
      } else {
        send(q);
        send(k);
      }
    }
  }
  return out;
}

std::vector<int> assign_stages(const Transfers& tr, const SendOrder& order, int stages) {
  std::vector<int> stage(tr.xfers.size(), 1);
  if (stages <= 1) return stage;
  auto bytes_of = [&](std::size_t i) {
    const Xfer& x = tr.xfers[i];
    return x.tokens * (x.kind == RowKind::qo ? order.qo_out : order.kv_out);
  };
  // Stage s ends at the fraction (2^s - 1) / (2^N - 1) of the bytes: each
  // stage moves twice the bytes of the one before, so the first (exposed: only
  // stage 0's local work hides it) is small and each later one arrives while
  // the previous, larger stage computes. cum[s] = 2^s - 1.
  std::vector<__int128> cum(static_cast<std::size_t>(stages) + 1, 0);
  for (int s = 1; s <= stages; ++s) cum[static_cast<std::size_t>(s)] = (static_cast<__int128>(1) << s) - 1;
  const __int128 denom = cum[static_cast<std::size_t>(stages)];
  // order.seq holds every xfer once, grouped by dst like tr.xfers.
  for (std::size_t d = 0; d + 1 < tr.dst_begin.size(); ++d) {
    const std::size_t x0 = tr.dst_begin[d], x1 = tr.dst_begin[d + 1];
    Bytes total = 0;
    for (std::size_t i = x0; i < x1; ++i) total += bytes_of(static_cast<std::size_t>(order.seq[i]));
    Bytes before = 0;
    int s = 1;
    for (std::size_t i = x0; i < x1; ++i) {
      const auto x = static_cast<std::size_t>(order.seq[i]);
      // Smallest s with before < total x (2^s - 1) / (2^N - 1), exact in 128-bit
      // integers (before only grows, so s never goes back).
      while (s < stages && static_cast<__int128>(before) * denom >= static_cast<__int128>(total) * cum[static_cast<std::size_t>(s)])
        ++s;
      stage[x] = s;
      before += bytes_of(x);
    }
  }
  return stage;
}

}  // namespace cpsched::plan_detail
