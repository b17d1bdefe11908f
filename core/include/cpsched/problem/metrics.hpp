#pragma once
// Metrics of an assignment, exact and token-granular (docs/design.md#metrics).
#include <array>
#include <cstdint>
#include <vector>

#include "cpsched/base/row_kind.hpp"
#include "cpsched/problem/assignment.hpp"

namespace cpsched {

using Bytes = std::int64_t;

struct PassMetrics {
  std::vector<Bytes> send;  // per rank, network bytes
  std::vector<Bytes> recv;
  Bytes total_send = 0;
  Bytes bottleneck = 0;     // max over ranks of max(send, recv)
};

// One transfer of a pass: `tokens` tokens of a block hosted by `host` needed
// on rank `dst` by head group `group`.
struct Transfer {
  RowKind kind;
  std::int32_t block;
  int group;
  Rank host;
  Rank dst;
  Token tokens;
};

struct Metrics {
  PassMetrics fwd;
  PassMetrics bwd;
  std::vector<std::int64_t> load;   // area x heads, per rank
  std::vector<std::int64_t> stage0_load;
  double imbalance = 1.0;           // max load / mean load
  double stage0_share = 0.0;        // stage-0 load over all load
  Token remote_qo_tokens = 0;       // sum over transfers (token x group)
  Token remote_kv_tokens = 0;
};


// Bytes per token of each direction of a transfer (docs/design.md#metrics table).
struct TransferBytes {
  Bytes qo_out, qo_back, kv_out, kv_back;
};
TransferBytes fwd_bytes_per_token(const Problem& p);
TransferBytes bwd_bytes_per_token(const Problem& p);

// The metrics of an assignment whose transfers are `transfers` (the plan
// builder's: PlanBuilder::transfers, or transfers(a) of plan/builder.hpp,
// which also has compute_metrics(a)).
Metrics compute_metrics(const Assignment& a, const std::vector<Transfer>& transfers);

// All the metrics read of the transfers: per rank, the tokens it sends as a
// block's host and receives as a computing rank, per kind (index_of), summed
// over the transfers. The plan builder counts them without keeping every
// transfer (PlanBuilder::metrics).
struct TransferTokens {
  std::array<std::vector<Token>, 2> sent;      // [kind][rank]
  std::array<std::vector<Token>, 2> received;  // [kind][rank]
};
TransferTokens transfer_tokens(int cp_size, const std::vector<Transfer>& transfers);
// The same metrics as from the transfers these tokens sum.
Metrics compute_metrics(const Assignment& a, const TransferTokens& tokens);

// USP's closed-form forward volume per rank (docs/design.md#metrics), Ulysses degree u.
double usp_closed_form_fwd_bytes_per_rank(const Problem& p, int ulysses_degree);
// The Ulysses degree of the usp baseline: largest divisor of P at most
// min(max_degree, hkv).
int usp_ulysses_degree(int cp_size, int heads_kv, int max_degree = 8);

}  // namespace cpsched
