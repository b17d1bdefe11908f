#pragma once
// Translation of a rank's CommMeta into per-peer message lists with byte
// offsets: what the NCCL calls of every stage send and receive, and where each
// byte comes from or goes to.
//
// Every collective has two sides:
//  * the packed side (the host of the rows): the rank's input splits. A
//    message to peer p is the concatenation, tensor by tensor, of the input
//    splits naming p, in split order; a split with several receivers is packed
//    once per receiver. The group-cast packs local rows into such messages and
//    sends them; the group-reduce receives messages of the same layout (other
//    tensors) and reduces them into the local rows.
//  * the buffer side (the computing rank): its output splits. The splits from
//    one source are consecutive rows of the remote buffer, so each (peer,
//    tensor) is one contiguous block of the remote tensor: the group-cast
//    receives straight into it and the group-reduce sends straight from it.
// Both sides of a pair list the same tensors in the same order with the same
// byte counts; that is what the NCCL calls must agree on (cross-checked in the
// MPI test), and one ncclSend/ncclRecv is issued per (peer, tensor).
#include <string>
#include <vector>

#include "cpsched/plan/plan.hpp"
#include "layout.hpp"

namespace cpsched::gpu {

// `rows` rows of one tensor of one split, in the message at `offset`.
struct Segment {
  Tensor tensor = Tensor::q;
  int split = 0;       // input split (packed side) or output split (buffer side)
  int group = -1;
  Token row = 0;       // first row: local buffer (packed side), remote buffer (buffer side)
  Token rows = 0;
  Bytes offset = 0;    // in the message
  Bytes bytes = 0;
};

struct Chunk {          // one NCCL call
  Tensor tensor = Tensor::q;
  Bytes offset = 0;     // in the message
  Bytes bytes = 0;
  Token row = 0;        // buffer side: first remote row of the chunk
};

struct Message {
  Rank peer = 0;
  Bytes offset = 0;     // packed side: where the message starts in the stage's staging buffer
  Bytes bytes = 0;
  std::vector<Chunk> chunks;      // tensor order; zero-byte chunks are kept (and skipped by the caller)
  std::vector<Segment> segments;  // tensor-major, then split order
};

struct Side {
  std::vector<Message> messages;  // ascending peer, only peers with rows
  Bytes bytes = 0;                // sum of the messages
};

// Packed side of `arg` for `tensors`. Throws cpsched::Error when a split
// names the rank itself or an input split is malformed.
Side packed_side(const GroupCollectiveArg& arg, std::span<const Tensor> tensors, const HeadLayout& h, Rank self);
// Buffer side: output splits at remote rows [recv_offset, ...). Throws when
// the splits of one source are not consecutive or the groups mix -1 and >= 0.
Side buffer_side(const GroupCollectiveArg& arg, Token recv_offset, std::span<const Tensor> tensors,
                 const HeadLayout& h, Rank self);

// The four directions of one kind in one stage.
struct KindLists {
  Side cast_send;     // packed
  Side cast_recv;     // buffer
  Side reduce_send;   // buffer (empty tensor list: no messages)
  Side reduce_recv;   // packed
};

struct StageLists {
  int stage = 1;
  KindLists qo;
  KindLists kv;
  // The forwarding phase (relays, plan.hpp): the packed side indexes rows of
  // this stage's receive buffer (counted from its start), the buffer side
  // follows the first phase's rows. Empty without relays.
  KindLists qo_fwd;
  KindLists kv_fwd;
  const KindLists& of(RowKind k) const { return k == RowKind::qo ? qo : kv; }
  const KindLists& fwd_of(RowKind k) const { return k == RowKind::qo ? qo_fwd : kv_fwd; }
};

struct PassLists {
  Pass pass = Pass::fwd;
  std::vector<StageLists> stages;  // [s-1]
};

PassLists translate(const PassPlan& plan, Pass pass, const HeadLayout& h, Rank self);

// One NCCL call of a rank, as its peer must mirror it.
struct WireOp {
  std::int8_t pass = 0;   // Pass
  std::int8_t kind = 0;   // RowKind
  std::int8_t phase = 0;  // 0 group-cast, 1 group-reduce, 2 forwarding cast, 3 forwarding reduce (relays)
  std::int8_t send = 0;
  std::int32_t stage = 0;
  Rank self = 0;
  Rank peer = 0;
  std::int32_t tensor = 0;
  Bytes bytes = 0;
};

// A rank's calls in issue order (zero-byte chunks left out, as the pipeline does).
std::vector<WireOp> wire_ops(const PassLists& fwd, const PassLists& bwd, Rank self);

// Every rank's calls: for each (pass, stage, kind, phase) and ordered pair
// (src, dst), src's sends must equal dst's receives call by call (tensor and
// bytes). Returns the mismatches found, empty when all agree.
std::vector<std::string> cross_check(const std::vector<std::vector<WireOp>>& per_rank);

}  // namespace cpsched::gpu
