#include "cpsched/problem/metrics.hpp"

#include <algorithm>
#include <numeric>

namespace cpsched {

// docs/design.md#metrics with the head geometry's row sizes (docs/heads.md): Q and dQ
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
// A rank sends a transfer's out bytes as its host and its back bytes as its
// receiver (and receives the other way round).
void account(PassMetrics& m, const TransferTokens& tk, const TransferBytes& b) {
  const std::size_t Q = static_cast<std::size_t>(index_of(RowKind::qo)), K = static_cast<std::size_t>(index_of(RowKind::kv));
  for (std::size_t r = 0; r < m.send.size(); ++r) {
    m.send[r] = tk.sent[Q][r] * b.qo_out + tk.sent[K][r] * b.kv_out + tk.received[Q][r] * b.qo_back +
                tk.received[K][r] * b.kv_back;
    m.recv[r] = tk.received[Q][r] * b.qo_out + tk.received[K][r] * b.kv_out + tk.sent[Q][r] * b.qo_back +
                tk.sent[K][r] * b.kv_back;
    m.total_send += m.send[r];
    m.bottleneck = std::max({m.bottleneck, m.send[r], m.recv[r]});
  }
}
}  // namespace

TransferTokens transfer_tokens(int cp_size, const std::vector<Transfer>& ts) {
  const auto P = static_cast<std::size_t>(cp_size);
  TransferTokens tk;
  for (int k = 0; k < 2; ++k) {
    tk.sent[static_cast<std::size_t>(k)].assign(P, 0);
    tk.received[static_cast<std::size_t>(k)].assign(P, 0);
  }
  for (const Transfer& t : ts) {
    const auto k = static_cast<std::size_t>(index_of(t.kind));
    tk.sent[k][static_cast<std::size_t>(t.host)] += t.tokens;
    tk.received[k][static_cast<std::size_t>(t.dst)] += t.tokens;
  }
  return tk;
}

Metrics compute_metrics(const Assignment& a, const std::vector<Transfer>& ts) {
  return compute_metrics(a, transfer_tokens(a.grid->cp_size(), ts));
}

Metrics compute_metrics(const Assignment& a, const TransferTokens& tk) {
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

  for (std::size_t r = 0; r < P; ++r) {
    m.remote_qo_tokens += tk.sent[static_cast<std::size_t>(index_of(RowKind::qo))][r];
    m.remote_kv_tokens += tk.sent[static_cast<std::size_t>(index_of(RowKind::kv))][r];
  }
  account(m.fwd, tk, fwd_bytes_per_token(p));
  account(m.bwd, tk, bwd_bytes_per_token(p));
  return m;
}

double usp_closed_form_fwd_bytes_per_rank(const Problem& p, int u) {
  const double P = p.cp_size(), U = u;
  const double per_rank = static_cast<double>(p.seqlen()) / P;
  const double hq = p.heads.q, hkv = p.heads.kv;
  // Rows relative to d_qk: Q + O (all-to-all), K + V (all-to-all and ring);
  // both 2 under GQA, so the formula stays docs/design.md#metrics's bit for bit.
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
