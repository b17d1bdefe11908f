#pragma once
// Every device buffer of a rank, and its size. One visitor lists them, so the
// sizes the tests and reports show are exactly what the pipeline allocates.
//
// Local (one set for both passes, rows = the rank's shard, all heads):
//   q, k, v, dO (bf16 inputs); o (bf16 forward output, the backward's O);
//   o_acc, lse_acc (fp32 forward accumulators; lse_acc is the final lse);
//   delta (fp32 rowsum(dO * O)); dq_acc, dk_acc, dv_acc (fp32 gradients).
// Remote (one set per pass, rows = all stages' receive rows, one group's heads
// when head groups are flattened):
//   forward:  q, k, v in; o_acc, lse_acc accumulators; o_wire (bf16 O sent back)
//   backward: q, o, dO, lse, k, v in; delta; dq/dk/dv accumulators and wires.
// Staging (per pass): per stage, the packed messages of the group-casts it
// sends and of the group-reduces it receives (transfers.hpp).
#include <string>
#include <vector>

#include "cpsched/plan/plan.hpp"
#include "host/programs/hd.hpp"
#include "layout.hpp"
#include "transfers.hpp"

namespace cpsched::gpu {

struct LocalBuffers {
  bf16 *q = nullptr, *k = nullptr, *v = nullptr, *d_o = nullptr, *o = nullptr;
  float *o_acc = nullptr, *lse_acc = nullptr, *delta = nullptr, *dq_acc = nullptr, *dk_acc = nullptr,
        *dv_acc = nullptr;
};

struct RemoteBuffers {
  bf16 *q = nullptr, *o = nullptr, *d_o = nullptr, *k = nullptr, *v = nullptr;
  float *lse = nullptr, *delta = nullptr;
  float *o_acc = nullptr, *lse_acc = nullptr, *dq_acc = nullptr, *dk_acc = nullptr, *dv_acc = nullptr;
  bf16 *o_wire = nullptr, *dq_wire = nullptr, *dk_wire = nullptr, *dv_wire = nullptr;
  std::uint8_t* staging = nullptr;
};

// Rows and heads per row of a pass's remote buffers.
struct RemoteShape {
  Token qo_rows = 0;
  Token kv_rows = 0;
  int q_heads = 0;   // heads per remote QO row
  int kv_heads = 0;
};
RemoteShape remote_shape(const PassPlan& plan, const HeadLayout& h);

// Per stage: where its staging starts and the offsets of its four parts.
struct StageStaging {
  Bytes offset = 0;
  Bytes qo_cast = 0, kv_cast = 0, qo_reduce = 0, kv_reduce = 0;  // offsets inside the stage
  // Forwarding phase (relays): the relay's packed forwards and the partials it gets back.
  Bytes qo_fwd_cast = 0, kv_fwd_cast = 0, qo_fwd_reduce = 0, kv_fwd_reduce = 0;
  Bytes bytes = 0;
};
std::vector<StageStaging> staging_layout(const PassLists& lists);

// `tail`: zero rows after every buffer (the SDPA path's, sdpa_batches.hpp's kSdpaTailRows).
// MLA: Q, K, dQ, dK hold d_qk per head, O, dO, V, dV d_v; with a shared
// latent V and dV take no bytes (null: the latent's rows serve).
template <class F>
void visit_local(LocalBuffers& b, const HeadLayout& h, Token rows, F&& f, Token tail = 0) {
  rows += tail;
  const Bytes q = rows * h.hq * h.dim, o = rows * h.hq * h.dv(), k = rows * h.hkv * h.dim,
              v = h.shared ? 0 : rows * h.hkv * h.dv(), qh = rows * h.hq;
  f("q", q * 2, b.q);
  f("k", k * 2, b.k);
  f("v", v * 2, b.v);
  f("do", o * 2, b.d_o);
  f("o", o * 2, b.o);
  f("o_acc", o * 4, b.o_acc);
  f("lse_acc", qh * 4, b.lse_acc);
  f("delta", qh * 4, b.delta);
  f("dq_acc", q * 4, b.dq_acc);
  f("dk_acc", k * 4, b.dk_acc);
  f("dv_acc", v * 4, b.dv_acc);
}

template <class F>
void visit_remote(RemoteBuffers& b, Pass pass, const RemoteShape& s, const HeadLayout& h, Bytes staging, F&& f,
                  Token tail = 0) {
  const Token qr = s.qo_rows + tail, kr = s.kv_rows + tail;
  const Bytes q = qr * s.q_heads * h.dim, o = qr * s.q_heads * h.dv(), k = kr * s.kv_heads * h.dim,
              v = h.shared ? 0 : kr * s.kv_heads * h.dv(), qh = qr * s.q_heads;
  f("remote q", q * 2, b.q);
  f("remote k", k * 2, b.k);
  f("remote v", v * 2, b.v);
  if (pass == Pass::fwd) {
    f("remote o_acc", o * 4, b.o_acc);
    f("remote lse_acc", qh * 4, b.lse_acc);
    f("remote o_wire", o * 2, b.o_wire);
  } else {
    f("remote o", o * 2, b.o);
    f("remote do", o * 2, b.d_o);
    f("remote lse", qh * 4, b.lse);
    f("remote delta", qh * 4, b.delta);
    f("remote dq_acc", q * 4, b.dq_acc);
    f("remote dk_acc", k * 4, b.dk_acc);
    f("remote dv_acc", v * 4, b.dv_acc);
    f("remote dq_wire", q * 2, b.dq_wire);
    f("remote dk_wire", k * 2, b.dk_wire);
    f("remote dv_wire", v * 2, b.dv_wire);
  }
  f("staging", staging, b.staging);
}

struct Region {
  std::string name;
  Bytes bytes = 0;
};

struct BufferSizes {
  std::vector<Region> local;
  std::vector<Region> remote[2];  // [fwd, bwd]
  std::vector<StageStaging> staging[2];
  Bytes local_bytes = 0;
  Bytes remote_bytes[2] = {0, 0};
  Bytes total() const { return local_bytes + remote_bytes[0] + remote_bytes[1]; }
};

// `tail`: as visit_local's (0 without the SDPA path).
BufferSizes buffer_sizes(const RankPlan& plan, const PassLists& fwd, const PassLists& bwd, const HeadLayout& h,
                         Token local_rows, Token tail = 0);

}  // namespace cpsched::gpu
