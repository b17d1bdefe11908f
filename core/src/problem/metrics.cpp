#include "cpsched/problem/metrics.hpp"

#include <algorithm>
#include <numeric>

namespace cpsched {

namespace {

// Collects the needed ranges of one block per (group, destination) bucket and
// emits their unions as transfers. Buckets are intrusive lists over a table
// kept across blocks (only touched buckets are reset), so a block costs
// O(its needs), not O(G x P).
class BlockNeeds {
 public:
  BlockNeeds(int groups, int cp_size)
      : P_(cp_size), head_(static_cast<std::size_t>(groups) * static_cast<std::size_t>(cp_size), -1) {}

  void add(int group, Rank dst, Range r) {
    const auto b = static_cast<std::size_t>(group) * static_cast<std::size_t>(P_) + static_cast<std::size_t>(dst);
    if (head_[b] < 0) touched_.push_back(static_cast<std::int32_t>(b));
    items_.push_back({r, head_[b]});
    head_[b] = static_cast<std::int32_t>(items_.size() - 1);
  }

  // `flattened`: bucket group g is head group g; else every need is group -1.
  void emit(RowKind kind, std::int32_t block, Rank host, bool flattened, std::vector<Transfer>& out) {
    std::sort(touched_.begin(), touched_.end());
    for (std::int32_t b : touched_) {
      ranges_.clear();
      for (std::int32_t i = head_[static_cast<std::size_t>(b)]; i >= 0; i = items_[static_cast<std::size_t>(i)].next)
        ranges_.push_back(items_[static_cast<std::size_t>(i)].r);
      head_[static_cast<std::size_t>(b)] = -1;
      if (ranges_.size() > 1) std::sort(ranges_.begin(), ranges_.end());
      Token tokens = 0, cur_b = ranges_[0].begin, cur_e = ranges_[0].end;
      for (const Range& r : ranges_) {
        if (r.begin > cur_e) {
          tokens += cur_e - cur_b;
          cur_b = r.begin;
        }
        cur_e = std::max(cur_e, r.end);
      }
      tokens += cur_e - cur_b;
      const int group = flattened ? b / P_ : -1;
      out.push_back(Transfer{kind, block, group, host, static_cast<Rank>(b % P_), tokens});
    }
    touched_.clear();
    items_.clear();
  }

 private:
  struct Item {
    Range r;
    std::int32_t next;
  };
  int P_;
  std::vector<std::int32_t> head_;
  std::vector<std::int32_t> touched_;
  std::vector<Item> items_;
  std::vector<Range> ranges_;
};

}  // namespace

std::vector<Transfer> transfers(const Assignment& a) {
  const TaskGrid& g = *a.grid;
  const auto& cells = g.cells();
  const int G = g.num_groups();
  const bool flat = g.flattened();
  std::vector<Transfer> out;
  BlockNeeds needs(G, g.cp_size());

  // QO: cells are sorted by q block, so each block's cells are contiguous.
  for (std::size_t c0 = 0; c0 < cells.size();) {
    std::size_t c1 = c0;
    const std::int32_t qb = cells[c0].qblock;
    const Rank host = g.sharding().host[static_cast<std::size_t>(qb)];
    for (; c1 < cells.size() && cells[c1].qblock == qb; ++c1)
      for (int grp = 0; grp < G; ++grp) {
        const std::size_t t = c1 * static_cast<std::size_t>(G) + static_cast<std::size_t>(grp);
        const Rank r = a.rank[t];
        if (r == host) continue;
        for (Range x : g.cell_of(static_cast<TaskId>(t)).rows.ranges()) needs.add(grp, r, x);
      }
    needs.emit(RowKind::qo, qb, host, flat, out);
    c0 = c1;
  }

  // KV: bucket the cells by kv block (counting sort keeps q order inside a bucket).
  const auto nb = static_cast<std::size_t>(g.sharding().num_blocks());
  std::vector<std::size_t> start(nb + 1, 0);
  for (const Cell& c : cells) ++start[static_cast<std::size_t>(c.kblock) + 1];
  std::partial_sum(start.begin(), start.end(), start.begin());
  std::vector<std::size_t> by_k(cells.size());
  {
    std::vector<std::size_t> fill(start.begin(), start.end() - 1);
    for (std::size_t c = 0; c < cells.size(); ++c) by_k[fill[static_cast<std::size_t>(cells[c].kblock)]++] = c;
  }
  for (std::size_t kb = 0; kb < nb; ++kb) {
    if (start[kb] == start[kb + 1]) continue;
    const Rank host = g.sharding().host[kb];
    for (std::size_t i = start[kb]; i < start[kb + 1]; ++i) {
      const std::size_t c = by_k[i];
      for (int grp = 0; grp < G; ++grp) {
        const std::size_t t = c * static_cast<std::size_t>(G) + static_cast<std::size_t>(grp);
        const Rank r = a.rank[t];
        if (r == host) continue;
        for (Range x : g.cell_of(static_cast<TaskId>(t)).cols.ranges()) needs.add(grp, r, x);
      }
    }
    needs.emit(RowKind::kv, static_cast<std::int32_t>(kb), host, flat, out);
  }
  return out;
}

// DESIGN §5 with the head geometry's row sizes (docs/heads.md): Q and dQ
// carry d_qk, O and dO d_v, K and V d_qk + d_v (one d_qk latent when shared).
TransferBytes fwd_bytes_per_token(const Problem& p) {
  const Bytes h = p.q_heads_per_task(), hk = p.kv_heads_per_task();
  const Heads& x = p.heads;
  return {h * x.q_row_bytes(), h * (x.o_row_bytes() + Heads::lse_bytes()), hk * x.kv_row_bytes(), 0};
}

TransferBytes bwd_bytes_per_token(const Problem& p) {
  const Bytes h = p.q_heads_per_task(), hk = p.kv_heads_per_task();
  const Heads& x = p.heads;
  return {h * (x.q_row_bytes() + 2 * x.o_row_bytes() + Heads::lse_bytes()), h * x.q_row_bytes(),
          hk * x.kv_row_bytes(), hk * x.kv_row_bytes()};
}

namespace {
void account(PassMetrics& m, const std::vector<Transfer>& ts, const TransferBytes& b) {
  for (const Transfer& t : ts) {
    const bool qo = t.kind == RowKind::qo;
    const Bytes out = t.tokens * (qo ? b.qo_out : b.kv_out);
    const Bytes back = t.tokens * (qo ? b.qo_back : b.kv_back);
    m.send[static_cast<std::size_t>(t.host)] += out;
    m.recv[static_cast<std::size_t>(t.dst)] += out;
    m.send[static_cast<std::size_t>(t.dst)] += back;
    m.recv[static_cast<std::size_t>(t.host)] += back;
  }
  for (std::size_t r = 0; r < m.send.size(); ++r) {
    m.total_send += m.send[r];
    m.bottleneck = std::max({m.bottleneck, m.send[r], m.recv[r]});
  }
}
}  // namespace

Metrics compute_metrics(const Assignment& a) {
  const TaskGrid& g = *a.grid;
  const Problem& p = g.problem();
  const auto P = static_cast<std::size_t>(g.cp_size());
  Metrics m;
  m.fwd.send.assign(P, 0);
  m.fwd.recv.assign(P, 0);
  m.bwd = m.fwd;
  m.load.assign(P, 0);
  m.stage0_load.assign(P, 0);
  for (TaskId t = 0; t < g.num_tasks(); ++t) {
    const auto r = static_cast<std::size_t>(a.rank[static_cast<std::size_t>(t)]);
    m.load[r] += g.load(t);
    if (g.q_host(t) == a.rank[static_cast<std::size_t>(t)] && g.k_host(t) == a.rank[static_cast<std::size_t>(t)])
      m.stage0_load[r] += g.load(t);
  }
  const std::int64_t total = std::accumulate(m.load.begin(), m.load.end(), std::int64_t{0});
  const std::int64_t local = std::accumulate(m.stage0_load.begin(), m.stage0_load.end(), std::int64_t{0});
  const std::int64_t mx = m.load.empty() ? 0 : *std::max_element(m.load.begin(), m.load.end());
  m.imbalance = total > 0 ? static_cast<double>(mx) * static_cast<double>(P) / static_cast<double>(total) : 1.0;
  m.stage0_share = total > 0 ? static_cast<double>(local) / static_cast<double>(total) : 1.0;

  const std::vector<Transfer> ts = transfers(a);
  for (const Transfer& t : ts) (t.kind == RowKind::qo ? m.remote_qo_tokens : m.remote_kv_tokens) += t.tokens;
  account(m.fwd, ts, fwd_bytes_per_token(p));
  account(m.bwd, ts, bwd_bytes_per_token(p));
  return m;
}

double usp_closed_form_fwd_bytes_per_rank(const Problem& p, int u) {
  const double P = p.cp_size(), U = u;
  const double per_rank = static_cast<double>(p.seqlen()) / P;
  const double hq = p.heads.q, hkv = p.heads.kv;
  // Rows relative to d_qk: Q + O (all-to-all), K + V (all-to-all and ring);
  // both 2 under GQA, so the formula stays DESIGN §5's bit for bit.
  const double dqk = p.heads.dqk(), r = static_cast<double>(p.heads.dv()) / dqk;
  const double qo = 1.0 + r, kv = p.heads.kv_shared ? 1.0 : 1.0 + r;
  return per_rank * dqk * p.heads.dtype_bytes * (qo * hq * (U - 1) / U + kv * hkv * (U - 1) / U + kv * hkv * (P / U - 1));
}

int usp_ulysses_degree(int cp_size, int heads_kv, int max_degree) {
  const int cap = std::min(max_degree, heads_kv);
  for (int u = std::min(cap, cp_size); u > 1; --u)
    if (cp_size % u == 0) return u;
  return 1;
}

}  // namespace cpsched
