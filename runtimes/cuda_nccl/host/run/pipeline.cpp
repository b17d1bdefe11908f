#include "pipeline.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <fmt/format.h>
#include <type_traits>

#include "cpsched/base/error.hpp"
#include "cpsched/timing/model.hpp"
#include "host/plan/index_worklist.hpp"
#include "host/programs/index_programs.hpp"

namespace cpsched::gpu {

double pass_flops(const CalcMeta& calc, const Problem& problem, Pass pass) {
  // The timing model's count (timing/model.hpp), so measured TFLOP/s and
  // predicted times divide the same number.
  const cpsched::Pass p = pass == Pass::fwd ? cpsched::Pass::fwd : cpsched::Pass::bwd;
  double flops = 0;
  for (const AttnArg& a : calc.local_attn_args) flops += arg_flops(a, calc, problem, p);
  for (const auto& s : calc.remote_attn_args)
    for (const AttnArg& a : s) flops += arg_flops(a, calc, problem, p);
  return flops;
}

double cudnn_flops(const CalcMeta& calc, const PassRoutes& routes, const Problem& problem, Pass pass) {
  const cpsched::Pass p = pass == Pass::fwd ? cpsched::Pass::fwd : cpsched::Pass::bwd;
  double flops = 0;
  for (std::size_t s = 0; s < routes.reason.size(); ++s) {
    const auto& args = s == 0 ? calc.local_attn_args : calc.remote_attn_args[s - 1];
    for (std::size_t i = 0; i < args.size(); ++i)
      if (routes.reason[s][i] == RouteReason::cudnn) flops += arg_flops(args[i], calc, problem, p);
  }
  return flops;
}

namespace {

// Host copies of all kernel metadata, uploaded in one piece.
class MetaArena {
 public:
  template <class Xs>  // a std::vector or an IndexPool
  std::size_t add(const Xs& v) {
    using T = typename Xs::value_type;
    static_assert(std::is_trivially_copyable_v<T>);
    bytes_.resize((bytes_.size() + 15) / 16 * 16);
    const std::size_t off = bytes_.size();
    const auto* p = reinterpret_cast<const std::uint8_t*>(v.data());
    bytes_.insert(bytes_.end(), p, p + v.size() * sizeof(T));
    return off;
  }
  std::size_t size() const { return bytes_.size(); }
  void commit(Backend& be) {
    if (bytes_.empty()) return;
    base_ = static_cast<std::uint8_t*>(be.alloc(static_cast<Bytes>(bytes_.size())));
    be.upload(base_, bytes_.data(), static_cast<Bytes>(bytes_.size()));
    bytes_.clear();
    bytes_.shrink_to_fit();
  }
  template <class T>
  T* at(std::size_t off) const {
    return reinterpret_cast<T*>(base_ + off);
  }

 private:
  std::vector<std::uint8_t> bytes_;
  std::uint8_t* base_ = nullptr;
};

template <class T>
std::uint8_t* bytes_of(T* p) {
  return reinterpret_cast<std::uint8_t*>(p);
}

}  // namespace

RankPipeline::RankPipeline(Backend& be, const RankPlan& plan, const HeadLayout& h, Token local_rows,
                           const PipelineOptions& opt)
    : be_(be), h_(h), rows_(local_rows) {
  if (h_.dtype_bytes != 2)
    throw Error(fmt::format("cuda_nccl: dtype of {} bytes is not supported (the kernels take bf16, 2 bytes)",
                            h_.dtype_bytes));
  if (h_.dim % 2 != 0 || h_.dv() % 2 != 0)
    throw Error(fmt::format("cuda_nccl: head dims (d_qk {}, d_v {}) must be even", h_.dim, h_.dv()));
  const Rank self = be_.rank();
  lists_[0] = translate(plan.fwd, Pass::fwd, h_, self);
  lists_[1] = translate(plan.bwd, Pass::bwd, h_, self);
  // Routes first: the SDPA path pads every buffer with zero tail rows.
  SdpaPolicy pol;
  pol.mode = opt.attention;
  pol.max_band_graphs = opt.max_band_graphs;
  pol.min_band_area = opt.min_band_area;
  pol.backend_lacks = be_.sdpa_support();
  if (pol.mode == AttentionMode::cudnn && !pol.backend_lacks.empty())
    throw Error(fmt::format("cuda_nccl: rank {}: attention = cudnn, but {}", self, pol.backend_lacks));
  const PassPlan* pp[2] = {&plan.fwd, &plan.bwd};
  for (int p = 0; p < 2; ++p) {
    const Pass ps = p == 0 ? Pass::fwd : Pass::bwd;
    // Every batch's graph is built now (before any buffer); one cuDNN cannot
    // build sends its args to the kernels (automatic mode), and the pass is
    // batched again without them.
    SdpaPolicy pass_pol = pol;
    for (bool failed = true; failed;) {
      failed = false;
      sdpa_[p] = plan_sdpa(*pp[p], ps, h_, remote_shape(*pp[p], h_), rows_, pass_pol);
      for (const auto& st : sdpa_[p].batches)
        for (const SdpaBatch& b : st) {
          try {
            be_.sdpa_prepare(b.geo);
          } catch (const Error& e) {
            if (pol.mode == AttentionMode::cudnn) throw;
            sdpa_failures_.push_back(e.what());
            auto& ng = pass_pol.no_graph;
            ng.resize(sdpa_[p].batches.size());
            const auto s = static_cast<std::size_t>(b.stage);
            for (int i = 0; i < b.real; ++i) {
              const auto a = static_cast<std::size_t>(b.seqs[static_cast<std::size_t>(i)].arg);
              if (ng[s].size() <= a) ng[s].resize(a + 1, false);
              ng[s][a] = true;
            }
            failed = true;
          }
        }
    }
    for (const auto& st : sdpa_[p].batches)
      for (const SdpaBatch& b : st) {
        tail_ = kSdpaTailRows;
        scratch_bytes_ = std::max(scratch_bytes_, sdpa_scratch(b).bytes);
      }
  }
  // Kernels for the head dims, before any buffer or collective (on every rank
  // alike: the routes are a function of the plan); range args on the
  // runtime's kernels may need more than index args do.
  bool range_args = false;
  for (const PassSdpa& sd : sdpa_)
    for (const auto& st : sd.routes.reason)
      for (const RouteReason r : st)
        range_args = range_args || !(r == RouteReason::cudnn || r == RouteReason::index_arg ||
                                     r == RouteReason::index_rows || r == RouteReason::empty);
  if (const std::string why = be_.kernel_dims_lack(h_.dim, h_.dv(), h_.shared, range_args); !why.empty())
    throw Error(fmt::format("rank {}: {}", self, why));
  sizes_ = buffer_sizes(plan, lists_[0], lists_[1], h_, rows_, tail_);
  visit_local(local_, h_, rows_, [&](const char*, Bytes n, auto& ptr) {
    using P = std::remove_reference_t<decltype(ptr)>;
    ptr = static_cast<P>(be_.alloc(n));
  }, tail_);
  if (scratch_bytes_ > 0) scratch_ = static_cast<std::uint8_t*>(be_.alloc(scratch_bytes_));
  prepare(Pass::fwd, plan.fwd);
  prepare(Pass::bwd, plan.bwd);
}

int RankPipeline::num_launches(Pass p) const {
  int n = 0;
  for (const auto& s : pass_[static_cast<int>(p)].launches) n += static_cast<int>(s.size());
  for (const auto& s : pass_[static_cast<int>(p)].index) n += static_cast<int>(s.size());
  return n;
}

// prepare()'s state for one pass: the transfer metadata of every stage and the
// attention launches, gathered in one arena (their offsets kept pending) and
// uploaded in one piece, then resolved to device pointers.
class RankPipeline::PassBuilder {
 public:
  PassBuilder(RankPipeline& rp, Pass pass, const PassPlan& plan)
      : rp_(rp),
        h_(rp.h_),
        which_pass_(pass),
        plan_(plan),
        pp_(rp.pass_[static_cast<int>(pass)]),
        lists_(rp.lists_[static_cast<int>(pass)]),
        stg_(rp.sizes_.staging[static_cast<int>(pass)]),
        lb_(rp.local_),
        rb_(pp_.rb),
        n_(static_cast<int>(plan.comm.stages.size())),
        rg_(h_.groups > 1 ? 0 : -1),
        pending_(static_cast<std::size_t>(n_)) {}

  void build_stages();
  void build_launches();
  void build_sdpa();
  void upload_and_resolve();

 private:
  // Arena offsets of a stage's segment tables, resolved after the upload.
  struct PendingStage {
    std::size_t pack = 0, fwd_pack = 0;
    std::vector<std::size_t> qo_unpack, kv_unpack, qo_fwd_unpack, kv_fwd_unpack;
  };
  struct PendingLaunch {
    std::size_t s, i;
    std::size_t tiles, begins, entries;
  };
  struct PendingIndex {
    std::size_t s, i;
    std::size_t major, begin, items, u_rows, u_masks;
  };
  struct PendingSdpa {
    std::size_t s, i;
    std::size_t q, k, out_q, out_stats, out_k, seq_q, seq_k, stats_copy;
    std::vector<std::size_t> layers;
  };
  // The q and k sides every attention launch of the pass reads.
  struct Operands {
    QSide q_local, q_remote;
    KSide k_local, k_remote;
  };
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);

  std::uint8_t* local_src(Tensor t) const;
  std::uint8_t* remote_buf(Tensor t) const;
  // Where a buffer-side chunk starts: its row of the remote tensor.
  std::uint8_t* remote_row(const Chunk& c) const { return remote_buf(c.tensor) + c.row * h_.row_bytes(c.tensor, rg_); }

  // First phase: pack local rows (one head group of all heads), reduce into
  // the local accumulators at the rows' head offset.
  CopySeg local_pack(const Segment& g) const;
  MergeSeg local_merge(const Segment& o) const;
  SumSeg local_sum(const Segment& g) const;
  // Forwarding phase (relays): remote rows hold the group's heads only, so
  // whole rows are forwarded, and what comes back goes into the relay's
  // remote accumulators (rows of q_heads / kv_heads heads) after `off`.
  CopySeg relay_pack(Token off, const Segment& g) const;
  MergeSeg relay_merge(Token off, const Segment& o) const;
  SumSeg relay_sum(Token off, const Segment& g) const;

  void build_stage(std::size_t i);
  template <class PackFrom>
  void add_cast(const KindLists& kl, std::uint8_t* base, std::vector<CopySeg>& pack, std::vector<P2POp>& ops,
                PackFrom&& pack_from);
  template <class MergeInto, class SumInto>
  void add_reduce(const KindLists& kl, RowKind kind, std::uint8_t* base, std::vector<P2POp>& ops,
                  std::vector<std::size_t>& un, std::vector<Unpack>& uu, const char* phase, MergeInto&& merge_into,
                  SumInto&& sum_into);
  template <class MergeInto>
  std::vector<MergeSeg> merge_segs(const Message& m, const std::uint8_t* mb, const char* phase,
                                   MergeInto&& merge_into) const;
  template <class SumInto>
  std::vector<SumSeg> sum_segs(const Message& m, const std::uint8_t* mb, SumInto&& sum_into) const;
  template <class Seg>
  void add_unpack(const std::vector<Seg>& segs, std::vector<std::size_t>& un, std::vector<Unpack>& uu);

  Operands operands() const;
  void add_launch(std::size_t s, AttnKernel k, const WorkList& w, int major, const Operands& ops);
  IndexLaunch index_launch(int major, std::int32_t n, const Operands& ops) const;
  void add_index_q(std::size_t s, IndexKernel k, const IndexQList& w, int major, const Operands& ops);
  void add_index_k(std::size_t s, const IndexKList& w, int major, const Operands& ops);
  void add_sdpa(const SdpaBatch& b);

  RankPipeline& rp_;
  const HeadLayout& h_;
  const Pass which_pass_;
  const PassPlan& plan_;
  PassPrep& pp_;
  const PassLists& lists_;
  const std::vector<StageStaging>& stg_;
  const LocalBuffers& lb_;
  const RemoteBuffers& rb_;
  const int n_;   // communication stages
  const int rg_;  // group shape of remote rows
  MetaArena arena_;
  std::vector<PendingStage> pending_;
  std::vector<PendingLaunch> pl_;
  std::vector<PendingIndex> pi_;
  std::vector<PendingSdpa> ps_;
  std::size_t indices_at_ = kNone;
};

std::uint8_t* RankPipeline::PassBuilder::local_src(Tensor t) const {
  switch (t) {
    case Tensor::q: return bytes_of(lb_.q);
    case Tensor::k: return bytes_of(lb_.k);
    case Tensor::v: return bytes_of(lb_.v);
    case Tensor::o: return bytes_of(lb_.o);
    case Tensor::d_o: return bytes_of(lb_.d_o);
    case Tensor::lse: return bytes_of(lb_.lse_acc);
    default: break;
  }
  throw Error(fmt::format("cuda_nccl (internal): no local source for tensor {}", to_string(t)));
}

// Remote tensors the group-cast receives into and the group-reduce sends from.
std::uint8_t* RankPipeline::PassBuilder::remote_buf(Tensor t) const {
  switch (t) {
    case Tensor::q: return bytes_of(rb_.q);
    case Tensor::k: return bytes_of(rb_.k);
    case Tensor::v: return bytes_of(rb_.v);
    case Tensor::o: return which_pass_ == Pass::fwd ? bytes_of(rb_.o_wire) : bytes_of(rb_.o);
    case Tensor::d_o: return bytes_of(rb_.d_o);
    case Tensor::lse: return which_pass_ == Pass::fwd ? bytes_of(rb_.lse_acc) : bytes_of(rb_.lse);
    case Tensor::dq: return bytes_of(rb_.dq_wire);
    case Tensor::dk: return bytes_of(rb_.dk_wire);
    case Tensor::dv: return bytes_of(rb_.dv_wire);
  }
  return nullptr;
}

CopySeg RankPipeline::PassBuilder::local_pack(const Segment& g) const {
  const Bytes rowb = h_.row_bytes(g.tensor, g.group);
  const Bytes head_off =
      static_cast<Bytes>(h_.head_offset(g.tensor, g.group)) * h_.elems_per_head(g.tensor) * h_.elem_bytes(g.tensor);
  return CopySeg{local_src(g.tensor) + g.row * h_.local_row_bytes(g.tensor) + head_off, nullptr, g.rows,
                 h_.local_row_bytes(g.tensor), rowb, rowb};
}

MergeSeg RankPipeline::PassBuilder::local_merge(const Segment& o) const {
  const int off = h_.head_offset(Tensor::o, o.group);
  return MergeSeg{lb_.o_acc + (o.row * h_.hq + off) * h_.dv(), lb_.lse_acc + o.row * h_.hq + off, nullptr, nullptr,
                  o.rows, static_cast<i64>(h_.hq) * h_.dv(), h_.hq, h_.heads(Tensor::o, o.group), h_.dv()};
}

SumSeg RankPipeline::PassBuilder::local_sum(const Segment& g) const {
  float* acc = g.tensor == Tensor::dq ? lb_.dq_acc : g.tensor == Tensor::dk ? lb_.dk_acc : lb_.dv_acc;
  const int heads = h_.local_heads(g.tensor);
  const int off = h_.head_offset(g.tensor, g.group), d = h_.elems_per_head(g.tensor);
  return SumSeg{acc + (g.row * heads + off) * d, nullptr, g.rows, static_cast<i64>(heads) * d,
                static_cast<i64>(h_.heads(g.tensor, g.group)) * d};
}

CopySeg RankPipeline::PassBuilder::relay_pack(Token off, const Segment& g) const {
  const Bytes rowb = h_.row_bytes(g.tensor, rg_);
  return CopySeg{remote_buf(g.tensor) + (off + g.row) * rowb, nullptr, g.rows, rowb, rowb, rowb};
}

MergeSeg RankPipeline::PassBuilder::relay_merge(Token off, const Segment& o) const {
  const i64 qh = pp_.shape.q_heads, row = off + o.row;
  return MergeSeg{rb_.o_acc + row * qh * h_.dv(), rb_.lse_acc + row * qh, nullptr, nullptr, o.rows, qh * h_.dv(), qh,
                  static_cast<int>(qh), h_.dv()};
}

SumSeg RankPipeline::PassBuilder::relay_sum(Token off, const Segment& g) const {
  const bool q_side = g.tensor == Tensor::dq;
  float* acc = q_side ? rb_.dq_acc : g.tensor == Tensor::dk ? rb_.dk_acc : rb_.dv_acc;
  const i64 width = static_cast<i64>(q_side ? pp_.shape.q_heads : pp_.shape.kv_heads) * h_.elems_per_head(g.tensor);
  return SumSeg{acc + (off + g.row) * width, nullptr, g.rows, width, width};
}

// One unpack launch per received message (peers may return the same rows).
template <class Seg>
void RankPipeline::PassBuilder::add_unpack(const std::vector<Seg>& segs, std::vector<std::size_t>& un,
                                           std::vector<Unpack>& uu) {
  if (segs.empty()) return;
  un.push_back(arena_.add(segs));
  uu.push_back({nullptr, static_cast<int>(segs.size())});
}

// A group-cast: pack what `kl` sends into its messages at `base` (pack_from
// gives a segment's source, strides and row bytes), send their chunks, and
// receive straight into the remote tensors.
template <class PackFrom>
void RankPipeline::PassBuilder::add_cast(const KindLists& kl, std::uint8_t* base, std::vector<CopySeg>& pack,
                                         std::vector<P2POp>& ops, PackFrom&& pack_from) {
  for (const Message& m : kl.cast_send.messages) {
    for (const Segment& g : m.segments) {
      if (g.rows == 0) continue;
      CopySeg cs = pack_from(g);
      cs.dst = base + m.offset + g.offset;
      pack.push_back(cs);
    }
    for (const Chunk& c : m.chunks)
      if (c.bytes > 0) ops.push_back({true, m.peer, base + m.offset + c.offset, c.bytes});
  }
  for (const Message& m : kl.cast_recv.messages)
    for (const Chunk& c : m.chunks)
      if (c.bytes > 0) ops.push_back({false, m.peer, remote_row(c), c.bytes});
}

// A group-reduce: send straight from the remote wire tensors, receive each
// peer's message into staging at `base`, then merge (forward O, lse) into
// the accumulators merge_into names or sum (backward) into sum_into's.
template <class MergeInto, class SumInto>
void RankPipeline::PassBuilder::add_reduce(const KindLists& kl, RowKind kind, std::uint8_t* base,
                                           std::vector<P2POp>& ops, std::vector<std::size_t>& un,
                                           std::vector<Unpack>& uu, const char* phase, MergeInto&& merge_into,
                                           SumInto&& sum_into) {
  for (const Message& m : kl.reduce_send.messages)
    for (const Chunk& c : m.chunks)
      if (c.bytes > 0) ops.push_back({true, m.peer, remote_row(c), c.bytes});
  for (const Message& m : kl.reduce_recv.messages) {
    for (const Chunk& c : m.chunks)
      if (c.bytes > 0) ops.push_back({false, m.peer, base + m.offset + c.offset, c.bytes});
    const std::uint8_t* mb = base + m.offset;
    if (which_pass_ == Pass::fwd && kind == RowKind::qo)
      add_unpack(merge_segs(m, mb, phase, merge_into), un, uu);
    else if (which_pass_ == Pass::bwd)
      add_unpack(sum_segs(m, mb, sum_into), un, uu);
  }
}

// Forward O and lse of a received message, staged at `mb`.
template <class MergeInto>
std::vector<MergeSeg> RankPipeline::PassBuilder::merge_segs(const Message& m, const std::uint8_t* mb,
                                                            const char* phase, MergeInto&& merge_into) const {
  // Segments are tensor-major: every split's O, then every split's lse.
  const std::size_t n = m.segments.size() / 2;
  std::vector<MergeSeg> segs;
  for (std::size_t i = 0; i < n; ++i) {
    const Segment& o = m.segments[i];
    const Segment& l = m.segments[n + i];
    if (o.tensor != Tensor::o || l.tensor != Tensor::lse || o.split != l.split)
      throw Error(fmt::format("cuda_nccl (internal): {} reduce message is not (O..., lse...) per split", phase));
    if (o.rows == 0) continue;
    MergeSeg ms = merge_into(o);
    ms.o = reinterpret_cast<const bf16*>(mb + o.offset);
    ms.lse = reinterpret_cast<const float*>(mb + l.offset);
    segs.push_back(ms);
  }
  return segs;
}

// Backward gradients of a received message, staged at `mb`.
template <class SumInto>
std::vector<SumSeg> RankPipeline::PassBuilder::sum_segs(const Message& m, const std::uint8_t* mb,
                                                        SumInto&& sum_into) const {
  std::vector<SumSeg> segs;
  for (const Segment& g : m.segments) {
    if (g.rows == 0) continue;
    SumSeg ss = sum_into(g);
    ss.src = reinterpret_cast<const bf16*>(mb + g.offset);
    segs.push_back(ss);
  }
  return segs;
}

void RankPipeline::PassBuilder::build_stages() {
  pp_.stages.assign(static_cast<std::size_t>(n_), Stage{});
  for (std::size_t i = 0; i < static_cast<std::size_t>(n_); ++i) build_stage(i);
}

// Stage i + 1: both phases of both kinds, qo then kv (the arena's order).
void RankPipeline::PassBuilder::build_stage(std::size_t i) {
  const StageComm& sc = plan_.comm.stages[i];
  const StageLists& sl = lists_.stages[i];
  const StageStaging& ss = stg_[i];
  Stage& st = pp_.stages[i];
  PendingStage& pd = pending_[i];
  st.qo_off = sc.qo_recv_offset;
  st.qo_rows = sc.num_remote_qo_tokens;
  st.kv_off = sc.kv_recv_offset;
  st.kv_rows = sc.num_remote_kv_tokens;
  st.qo_after = sc.qo_reduce_after;
  st.kv_after = sc.kv_reduce_after;
  std::uint8_t* stage_base = rb_.staging + ss.offset;
  std::vector<CopySeg> pack, fwd_pack;
  for (RowKind kind : {RowKind::qo, RowKind::kv}) {
    const bool q = kind == RowKind::qo;
    add_cast(sl.of(kind), stage_base + (q ? ss.qo_cast : ss.kv_cast), pack, st.cast_ops,
             [&](const Segment& g) { return local_pack(g); });
    add_reduce(
        sl.of(kind), kind, stage_base + (q ? ss.qo_reduce : ss.kv_reduce), q ? st.qo_reduce_ops : st.kv_reduce_ops,
        q ? pd.qo_unpack : pd.kv_unpack, q ? st.qo_unpack : st.kv_unpack, "forward",
        [&](const Segment& o) { return local_merge(o); }, [&](const Segment& g) { return local_sum(g); });

    const Token off = q ? sc.qo_recv_offset : sc.kv_recv_offset;
    add_cast(sl.fwd_of(kind), stage_base + (q ? ss.qo_fwd_cast : ss.kv_fwd_cast), fwd_pack, st.fwd_cast_ops,
             [&](const Segment& g) { return relay_pack(off, g); });
    add_reduce(
        sl.fwd_of(kind), kind, stage_base + (q ? ss.qo_fwd_reduce : ss.kv_fwd_reduce),
        q ? st.qo_fwd_reduce_ops : st.kv_fwd_reduce_ops, q ? pd.qo_fwd_unpack : pd.kv_fwd_unpack,
        q ? st.qo_fwd_unpack : st.kv_fwd_unpack, "forwarding", [&](const Segment& o) { return relay_merge(off, o); },
        [&](const Segment& g) { return relay_sum(off, g); });
  }
  st.n_pack = static_cast<int>(pack.size());
  if (!pack.empty()) pd.pack = arena_.add(pack);
  st.n_fwd_pack = static_cast<int>(fwd_pack.size());
  if (!fwd_pack.empty()) pd.fwd_pack = arena_.add(fwd_pack);
}

RankPipeline::PassBuilder::Operands RankPipeline::PassBuilder::operands() const {
  const Pass pass = which_pass_;
  const LocalBuffers& lb = lb_;
  const RemoteBuffers& rb = rb_;
  const Token rows = rp_.rows_;
  const RemoteShape& sh = pp_.shape;
  const QSide q_local =
      pass == Pass::fwd
          ? QSide{lb.q, nullptr, nullptr, nullptr, nullptr, lb.o_acc, lb.lse_acc, nullptr, rows, h_.hq, 0}
          : QSide{lb.q, lb.o, lb.d_o, lb.lse_acc, lb.delta, nullptr, nullptr, lb.dq_acc, rows, h_.hq, 0};
  const QSide q_remote =
      pass == Pass::fwd
          ? QSide{rb.q, nullptr, nullptr, nullptr, nullptr, rb.o_acc, rb.lse_acc, nullptr, sh.qo_rows, sh.q_heads, 0}
          : QSide{rb.q, rb.o, rb.d_o, rb.lse, rb.delta, nullptr, nullptr, rb.dq_acc, sh.qo_rows, sh.q_heads, 0};
  // A shared latent: V is K's rows (first d_v of each head's d_qk), dV adds into dK.
  const bool sh_kv = h_.shared;
  const int vs = h_.v_stride();
  const KSide k_local{lb.k, sh_kv ? lb.k : lb.v, pass == Pass::bwd ? lb.dk_acc : nullptr,
                      pass == Pass::bwd ? (sh_kv ? lb.dk_acc : lb.dv_acc) : nullptr, rows, h_.hkv, vs};
  const KSide k_remote{rb.k, sh_kv ? rb.k : rb.v, rb.dk_acc, sh_kv ? rb.dk_acc : rb.dv_acc, sh.kv_rows, sh.kv_heads,
                       vs};
  return Operands{q_local, q_remote, k_local, k_remote};
}

// Attention launches of every stage: the runtime's own kernels on the args
// cuDNN does not take (range args: attention_programs.hpp; index args on
// tensor cores: index_programs.hpp).
void RankPipeline::PassBuilder::build_launches() {
  const Operands ops = operands();
  const PassSdpa& sd = rp_.sdpa_[static_cast<int>(which_pass_)];
  // Index args' keys: the pass's CalcMeta::indices, uploaded once with the
  // rest of the metadata (every q-major index launch of the pass reads them).
  indices_at_ = plan_.calc.indices.empty() ? kNone : arena_.add(plan_.calc.indices);
  const std::span<const std::int32_t> indices = plan_.calc.indices.span();
  // MLA: range args as index rows (index_worklist.hpp), their keys windows of
  // the run 0 .. n - 1 uploaded after the pool; rows_at: where it starts, in
  // keys from the pool's start (both arena offsets are 16-byte aligned).
  const bool as_rows = range_args_as_index_rows(h_);
  i64 rows_at = -1;
  if (as_rows) {
    i64 n = 0;
    for (const auto& args : sd.kernel_args)
      for (const AttnArg& a : args)
        if (!a.is_index()) n = std::max(n, a.k.end);
    if (n > 0) {
      std::vector<std::int32_t> run(static_cast<std::size_t>(n));
      for (std::size_t j = 0; j < run.size(); ++j) run[j] = static_cast<std::int32_t>(j);
      const std::size_t at = arena_.add(run);
      if (indices_at_ == kNone) indices_at_ = at;
      rows_at = static_cast<i64>((at - indices_at_) / sizeof(std::int32_t));
    }
  }
  pp_.launches.assign(static_cast<std::size_t>(n_) + 1, {});
  pp_.index.assign(static_cast<std::size_t>(n_) + 1, {});
  // Range args on cuDNN are the SDPA batches' (build_sdpa); the rest run here.
  for (int s = 0; s <= n_; ++s) {
    const std::vector<AttnArg>& args = sd.kernel_args[static_cast<std::size_t>(s)];
    const auto at = static_cast<std::size_t>(s);
    if (which_pass_ == Pass::fwd) {
      if (!as_rows) {
        add_launch(at, AttnKernel::fwd, q_major(args, BufferId::local), 0, ops);
        add_launch(at, AttnKernel::fwd, q_major(args, BufferId::remote), 1, ops);
      }
      add_index_q(at, IndexKernel::fwd, index_q_major(args, BufferId::local, indices, rows_at), 0, ops);
      add_index_q(at, IndexKernel::fwd, index_q_major(args, BufferId::remote, indices, rows_at), 1, ops);
    } else {
      if (!as_rows) {
        add_launch(at, AttnKernel::dq, q_major(args, BufferId::local), 0, ops);
        add_launch(at, AttnKernel::dq, q_major(args, BufferId::remote), 1, ops);
        add_launch(at, AttnKernel::dkdv, k_major(args, BufferId::local), 0, ops);
        add_launch(at, AttnKernel::dkdv, k_major(args, BufferId::remote), 1, ops);
      }
      add_index_q(at, IndexKernel::dq, index_q_major(args, BufferId::local, indices, rows_at), 0, ops);
      add_index_q(at, IndexKernel::dq, index_q_major(args, BufferId::remote, indices, rows_at), 1, ops);
      add_index_k(at, index_k_major(args, BufferId::local, indices, as_rows), 0, ops);
      add_index_k(at, index_k_major(args, BufferId::remote, indices, as_rows), 1, ops);
    }
  }
}

// A launch of stage `s` over `w` (major 0: local rows tiled, 1: remote rows).
void RankPipeline::PassBuilder::add_launch(std::size_t s, AttnKernel k, const WorkList& w, int major,
                                           const Operands& ops) {
  if (w.empty()) return;
  const bool q_major = k != AttnKernel::dkdv;
  const int slots = q_major ? (major == 0 ? h_.hq : pp_.shape.q_heads) : (major == 0 ? h_.hkv : pp_.shape.kv_heads);
  Launch L{k,
           AttnLaunch{{ops.q_local, ops.q_remote}, {ops.k_local, ops.k_remote}, nullptr, nullptr, nullptr,
                      w.num_tiles(), major, h_.hq, h_.hkv, h_.groups, slots,
                      1.0f / std::sqrt(static_cast<float>(h_.dim))},
           grid_of(w, slots)};
  auto& v = pp_.launches[s];
  pl_.push_back({s, v.size(), arena_.add(w.tile_start), arena_.add(w.entry_begin), arena_.add(w.entries)});
  v.push_back(L);
}

// Index launches: CTAs per (row or 16-col tile) x kv head slot (x block of
// query heads, q-major); slots are the kv heads of the tiled buffer's rows.
IndexLaunch RankPipeline::PassBuilder::index_launch(int major, std::int32_t n, const Operands& ops) const {
  return IndexLaunch{{ops.q_local, ops.q_remote},
                     {ops.k_local, ops.k_remote},
                     nullptr,
                     nullptr,
                     nullptr,
                     nullptr,
                     nullptr,
                     nullptr,
                     nullptr,
                     n,
                     major,
                     h_.hq,
                     h_.hkv,
                     h_.groups,
                     major == 0 ? h_.hkv : pp_.shape.kv_heads,
                     1.0f / std::sqrt(static_cast<float>(h_.dim)),
                     h_.shared ? 1 : 0};
}

void RankPipeline::PassBuilder::add_index_q(std::size_t s, IndexKernel k, const IndexQList& w, int major,
                                            const Operands& ops) {
  if (w.empty()) return;
  IndexLaunch p = index_launch(major, static_cast<std::int32_t>(w.rows.size()), ops);
  const int ratio = h_.hq / h_.hkv, per_block = index_block_heads(ratio, h_.dim);
  const int blocks = (ratio + per_block - 1) / per_block;
  auto& v = pp_.index[s];
  pi_.push_back({s, v.size(), arena_.add(w.rows), arena_.add(w.begin), arena_.add(w.items), kNone, kNone});
  v.push_back({k, p, Grid{static_cast<int>(w.rows.size()), p.slots * blocks, kIndexThreads}});
}

void RankPipeline::PassBuilder::add_index_k(std::size_t s, const IndexKList& w, int major, const Operands& ops) {
  if (w.empty()) return;
  IndexLaunch p = index_launch(major, static_cast<std::int32_t>(w.tiles.size()), ops);
  auto& v = pp_.index[s];
  pi_.push_back({s, v.size(), arena_.add(w.tiles), arena_.add(w.begin), arena_.add(w.items), arena_.add(w.rows),
                 arena_.add(w.masks)});
  v.push_back({IndexKernel::dkdv, p, Grid{static_cast<int>(w.tiles.size()), p.slots, kIndexThreads}});
}

// The cuDNN batches of every stage: the graph (built now, once per geometry),
// the ragged offsets, and the merges (forward) or sums (backward) that fold
// the packed outputs into the accumulators, in layers of disjoint rows.
void RankPipeline::PassBuilder::build_sdpa() {
  const PassSdpa& sd = rp_.sdpa_[static_cast<int>(which_pass_)];
  pp_.sdpa.assign(static_cast<std::size_t>(n_) + 1, {});
  for (const auto& stage : sd.batches)
    for (const SdpaBatch& b : stage) add_sdpa(b);
}

void RankPipeline::PassBuilder::add_sdpa(const SdpaBatch& b) {
  const bool fwd = which_pass_ == Pass::fwd;
  const bool ql = b.q_buf == BufferId::local, kl = b.k_buf == BufferId::local;
  const i64 D = h_.dim, qoff = b.q_head_off, koff = b.k_head_off;
  const i64 qrh = b.geo.q_row_heads, krh = b.geo.k_row_heads, qh = b.geo.q_heads, kh = b.geo.kv_heads;
  std::uint8_t* scratch = rp_.scratch_;
  const SdpaScratch at = sdpa_scratch(b);
  SdpaLaunch L;
  L.graph = rp_.be_.sdpa_prepare(b.geo);
  SdpaBind& bd = L.bind;
  bd.q = (ql ? lb_.q : rb_.q) + qoff * D;
  bd.k = (kl ? lb_.k : rb_.k) + koff * D;
  bd.v = (kl ? lb_.v : rb_.v) + koff * D;
  if (fwd) {
    bd.out_o = reinterpret_cast<bf16*>(scratch + at.o);
    bd.out_stats = reinterpret_cast<float*>(scratch + at.stats);
  } else {
    bd.o = (ql ? lb_.o : rb_.o) + qoff * D;
    bd.d_o = (ql ? lb_.d_o : rb_.d_o) + qoff * D;
    bd.stats = reinterpret_cast<const float*>(scratch + at.stats);
    bd.dq = reinterpret_cast<bf16*>(scratch + at.dq);
    bd.dk = reinterpret_cast<bf16*>(scratch + at.dk);
    bd.dv = reinterpret_cast<bf16*>(scratch + at.dv);
    // The merged lse of the batch's rows, packed (every sequence, dummies too).
    const float* lse = (ql ? lb_.lse_acc : rb_.lse) + qoff;
    std::vector<CopySeg> copy;
    for (const SdpaSeq& q : b.seqs)
      copy.push_back(CopySeg{reinterpret_cast<const std::uint8_t*>(lse + q.q_row * qrh),
                             scratch + at.stats + q.out_q * qh * 4, q.q_len, qrh * 4, qh * 4, qh * 4});
    L.stats_copy = arena_.add(copy);
    L.n_stats_copy = static_cast<int>(copy.size());
  }
  const SdpaOffsets off = sdpa_offsets(b);
  PendingSdpa pd{static_cast<std::size_t>(b.stage), pp_.sdpa[static_cast<std::size_t>(b.stage)].size(),
                 arena_.add(off.q),      arena_.add(off.k),     arena_.add(off.out_q), arena_.add(off.out_stats),
                 arena_.add(off.out_k),  arena_.add(off.seq_q), arena_.add(off.seq_k), L.stats_copy,
                 {}};

  // One segment per real sequence and tensor; layers keep each launch's targets disjoint.
  const std::vector<SdpaSeq> seqs(b.seqs.begin(), b.seqs.begin() + b.real);
  auto layered = [&](auto&& seg_of, auto&& foot_of, int tensors) {
    using Seg = decltype(seg_of(seqs[0], 0));
    std::vector<std::vector<Seg>> layers;
    for (int t = 0; t < tensors; ++t) {
      std::vector<Footprint> feet;
      for (const SdpaSeq& q : seqs) feet.push_back(foot_of(q, t));
      const std::vector<int> at = disjoint_layers(feet);
      for (std::size_t i = 0; i < seqs.size(); ++i) {
        if (static_cast<std::size_t>(at[i]) >= layers.size()) layers.resize(static_cast<std::size_t>(at[i]) + 1);
        layers[static_cast<std::size_t>(at[i])].push_back(seg_of(seqs[i], t));
      }
    }
    for (const auto& segs : layers) {
      pd.layers.push_back(arena_.add(segs));
      L.layers.push_back({nullptr, static_cast<int>(segs.size())});
    }
  };
  if (fwd) {
    float* o_acc = ql ? lb_.o_acc : rb_.o_acc;
    float* lse_acc = ql ? lb_.lse_acc : rb_.lse_acc;
    layered(
        [&](const SdpaSeq& q, int) {
          return MergeSeg{o_acc + (q.q_row * qrh + qoff) * D, lse_acc + q.q_row * qrh + qoff,
                          bd.out_o + q.out_q * qh * D,        bd.out_stats + q.out_q * qh,
                          q.q_len,                            qrh * D,
                          qrh,                                static_cast<std::int32_t>(qh),
                          static_cast<std::int32_t>(D)};
        },
        [&](const SdpaSeq& q, int) {
          return Footprint{q.q_row, q.q_row + q.q_len, static_cast<int>(qoff), static_cast<int>(qoff + qh)};
        },
        1);
  } else {
    float* acc[3] = {ql ? lb_.dq_acc : rb_.dq_acc, kl ? lb_.dk_acc : rb_.dk_acc, kl ? lb_.dv_acc : rb_.dv_acc};
    const bf16* src[3] = {bd.dq, bd.dk, bd.dv};
    layered(
        [&](const SdpaSeq& q, int t) {
          if (t == 0) return SumSeg{acc[0] + (q.q_row * qrh + qoff) * D, src[0] + q.out_q * qh * D, q.q_len, qrh * D, qh * D};
          return SumSeg{acc[t] + (q.k_row * krh + koff) * D, src[t] + q.out_k * kh * D, q.k_len, krh * D, kh * D};
        },
        [&](const SdpaSeq& q, int t) {  // per tensor: distinct tensors never overlap
          if (t == 0) return Footprint{q.q_row, q.q_row + q.q_len, static_cast<int>(qoff), static_cast<int>(qoff + qh)};
          return Footprint{q.k_row, q.k_row + q.k_len, static_cast<int>(koff), static_cast<int>(koff + kh)};
        },
        3);
  }
  pp_.sdpa[pd.s].push_back(std::move(L));
  ps_.push_back(std::move(pd));
}

void RankPipeline::PassBuilder::upload_and_resolve() {
  rp_.meta_bytes_ += static_cast<Bytes>(arena_.size());
  arena_.commit(rp_.be_);
  auto resolve = [&](std::vector<Unpack>& uu, const std::vector<std::size_t>& un) {
    for (std::size_t i = 0; i < uu.size(); ++i) uu[i].segs = arena_.at<void>(un[i]);
  };
  for (int s = 0; s < n_; ++s) {
    Stage& st = pp_.stages[static_cast<std::size_t>(s)];
    const PendingStage& pd = pending_[static_cast<std::size_t>(s)];
    if (st.n_pack > 0) st.pack = arena_.at<CopySeg>(pd.pack);
    if (st.n_fwd_pack > 0) st.fwd_pack = arena_.at<CopySeg>(pd.fwd_pack);
    resolve(st.qo_unpack, pd.qo_unpack);
    resolve(st.kv_unpack, pd.kv_unpack);
    resolve(st.qo_fwd_unpack, pd.qo_fwd_unpack);
    resolve(st.kv_fwd_unpack, pd.kv_fwd_unpack);
  }
  for (const PendingLaunch& x : pl_) {
    AttnLaunch& p = pp_.launches[x.s][x.i].p;
    p.tile_start = arena_.at<i64>(x.tiles);
    p.entry_begin = arena_.at<std::int32_t>(x.begins);
    p.entries = arena_.at<WorkEntry>(x.entries);
  }
  for (const PendingIndex& x : pi_) {
    IndexRun& r = pp_.index[x.s][x.i];
    IndexLaunch& p = r.p;
    p.major = arena_.at<i64>(x.major);
    p.begin = arena_.at<std::int32_t>(x.begin);
    if (r.kernel == IndexKernel::dkdv) {
      p.k_items = arena_.at<IndexKItem>(x.items);
      p.u_rows = arena_.at<std::int32_t>(x.u_rows);
      p.u_masks = arena_.at<std::uint32_t>(x.u_masks);
    } else {
      p.q_items = arena_.at<IndexQItem>(x.items);
      if (indices_at_ != kNone) p.indices = arena_.at<std::int32_t>(indices_at_);
    }
  }
  for (const PendingSdpa& x : ps_) {
    SdpaLaunch& L = pp_.sdpa[x.s][x.i];
    SdpaBind& b = L.bind;
    b.q_off = arena_.at<std::int32_t>(x.q);
    b.k_off = arena_.at<std::int32_t>(x.k);
    if (L.n_stats_copy > 0) L.stats_segs = arena_.at<CopySeg>(x.stats_copy);
    b.out_q_off = arena_.at<std::int32_t>(x.out_q);
    b.out_stats_off = arena_.at<std::int32_t>(x.out_stats);
    b.out_k_off = arena_.at<std::int32_t>(x.out_k);
    b.seq_q = arena_.at<std::int32_t>(x.seq_q);
    b.seq_k = arena_.at<std::int32_t>(x.seq_k);
    for (std::size_t l = 0; l < L.layers.size(); ++l) L.layers[l].segs = arena_.at<void>(x.layers[l]);
  }
}

void RankPipeline::prepare(Pass pass, const PassPlan& plan) {
  const int pi = static_cast<int>(pass);
  PassPrep& pp = pass_[pi];
  const int N = static_cast<int>(plan.comm.stages.size());
  if (static_cast<int>(plan.calc.remote_attn_args.size()) != N)
    throw Error(fmt::format("cuda_nccl: rank {} {}: {} communication stages but {} remote compute stages",
                            be_.rank(), to_string(pass), N, plan.calc.remote_attn_args.size()));
  pp.shape = remote_shape(plan, h_);
  const std::vector<StageStaging>& stg = sizes_.staging[pi];
  const Bytes staging_total = stg.empty() ? 0 : stg.back().offset + stg.back().bytes;
  visit_remote(pp.rb, pass, pp.shape, h_, staging_total, [&](const char*, Bytes n, auto& ptr) {
    using P = std::remove_reference_t<decltype(ptr)>;
    ptr = static_cast<P>(be_.alloc(n));
  }, tail_);

  const cpsched::Pass core_pass = pass == Pass::fwd ? cpsched::Pass::fwd : cpsched::Pass::bwd;
  pp.program = plan.program.empty() ? pass_program(plan.comm.stages, core_pass) : plan.program;
  if (const std::string why = program_error(pp.program, plan.comm.stages, core_pass); !why.empty())
    throw Error(fmt::format("cuda_nccl: rank {} {} program: {}", be_.rank(), to_string(pass), why));
  PassBuilder b(*this, pass, plan);
  b.build_stages();
  b.build_launches();
  b.build_sdpa();
  b.upload_and_resolve();
}

void RankPipeline::set_inputs(const RankInputs& in) {
  // MLA: q and k hold d_qk per head, dO and v d_v; with a shared latent v is empty.
  const auto nq = static_cast<std::size_t>(rows_ * h_.hq * h_.dim), nk = static_cast<std::size_t>(rows_ * h_.hkv * h_.dim);
  const auto no = static_cast<std::size_t>(rows_ * h_.hq * h_.dv()),
             nv = h_.shared ? std::size_t{0} : static_cast<std::size_t>(rows_ * h_.hkv * h_.dv());
  if (in.q.size() != nq || in.d_o.size() != no || in.k.size() != nk || in.v.size() != nv)
    throw Error(fmt::format("cuda_nccl: rank {} inputs have {} / {} / {} / {} elements (q, k, v, dO), expected {} / {} / {} / {}",
                            be_.rank(), in.q.size(), in.k.size(), in.v.size(), in.d_o.size(), nq, nk, nv, no));
  be_.upload(local_.q, in.q.data(), static_cast<Bytes>(nq * 2));
  be_.upload(local_.k, in.k.data(), static_cast<Bytes>(nk * 2));
  if (nv > 0) be_.upload(local_.v, in.v.data(), static_cast<Bytes>(nv * 2));
  be_.upload(local_.d_o, in.d_o.data(), static_cast<Bytes>(no * 2));
}

void RankPipeline::issue_cast(PassPrep& pp, int s, Phase phase, PassRun& run) {
  Stage& st = pp.stages[static_cast<std::size_t>(s - 1)];
  if (phase == Phase::first) {
    if (st.n_pack > 0) be_.copy(StreamId::comm, st.pack, st.n_pack);
    if (!st.cast_ops.empty()) be_.exchange(st.cast_ops);
  } else {
    // Relays forward rows of this stage's receive once it is in (comm stream order).
    if (st.n_fwd_pack > 0) be_.copy(StreamId::comm, st.fwd_pack, st.n_fwd_pack);
    if (!st.fwd_cast_ops.empty()) be_.exchange(st.fwd_cast_ops);
    // A stage is waited for after both phases (program_error): one event, after the second.
    run.cast_done[static_cast<std::size_t>(s)] = be_.record(StreamId::comm);
  }
}

void RankPipeline::issue_reduce(Pass pass, PassPrep& pp, const Instr& i, PassRun& run) {
  const int t = i.stage;
  const RowKind kind = i.kind;
  const Stage& st = pp.stages[static_cast<std::size_t>(t - 1)];
  const RemoteBuffers& rb = pp.rb;
  // O rows hold d_v per head, dQ and dK rows d_qk, dV rows d_v (none with a shared latent).
  const i64 qd = pass == Pass::fwd ? h_.dv() : h_.dim;
  const i64 qn = st.qo_rows * pp.shape.q_heads * qd, qo = st.qo_off * pp.shape.q_heads * qd;
  const i64 kn = st.kv_rows * pp.shape.kv_heads * h_.dim, ko = st.kv_off * pp.shape.kv_heads * h_.dim;
  const i64 vn = st.kv_rows * pp.shape.kv_heads * h_.dv(), vo = st.kv_off * pp.shape.kv_heads * h_.dv();
  // Partial results of stage t's rows to the wire dtype (lse travels as fp32).
  auto to_wire = [&] {
    if (kind == RowKind::qo) {
      if (pass == Pass::fwd) be_.convert(rb.o_acc + qo, rb.o_wire + qo, qn);
      else be_.convert(rb.dq_acc + qo, rb.dq_wire + qo, qn);
    } else {
      be_.convert(rb.dk_acc + ko, rb.dk_wire + ko, kn);
      if (!h_.shared) be_.convert(rb.dv_acc + vo, rb.dv_wire + vo, vn);
    }
  };
  // The partials go to the wire once per (stage, kind), again only where a
  // compute ran since.
  int& wired = run.wired[2 * static_cast<std::size_t>(t - 1) + static_cast<std::size_t>(kind)];
  if (wired != run.computes) {
    to_wire();
    be_.wait(StreamId::comm, be_.record(StreamId::compute));
    wired = run.computes;
  }
  if (i.phase == Phase::first) {
    const auto& ops = kind == RowKind::qo ? st.qo_reduce_ops : st.kv_reduce_ops;
    if (!ops.empty()) be_.exchange(ops);
    run.reduce_done.push_back(be_.record(StreamId::comm));
    return;
  }
  // Relays: forwarded partials come back first; a relay folds them into its
  // rows (one launch per peer: peers return the same rows) before they go on.
  const auto& fwd_ops = kind == RowKind::qo ? st.qo_fwd_reduce_ops : st.kv_fwd_reduce_ops;
  if (!fwd_ops.empty()) {
    be_.exchange(fwd_ops);
    const auto& back = kind == RowKind::qo ? st.qo_fwd_unpack : st.kv_fwd_unpack;
    if (!back.empty()) {
      be_.wait(StreamId::compute, be_.record(StreamId::comm));
      for (const Unpack& u : back) {
        if (pass == Pass::fwd && kind == RowKind::qo) be_.merge(static_cast<const MergeSeg*>(u.segs), u.n);
        else be_.sum(static_cast<const SumSeg*>(u.segs), u.n);
      }
      to_wire();
      be_.wait(StreamId::comm, be_.record(StreamId::compute));
    }
  }
}

// A stage: its cuDNN batches, each followed by the merges / sums of its
// outputs, then the runtime's kernels on the other args.
void RankPipeline::launch_stage(Pass pass, int s, bool sdpa_only) {
  const PassPrep& pp = pass_[static_cast<int>(pass)];
  for (const SdpaLaunch& L : pp.sdpa[static_cast<std::size_t>(s)]) {
    if (L.n_stats_copy > 0 && !sdpa_only) be_.copy(StreamId::compute, L.stats_segs, L.n_stats_copy);
    be_.sdpa_run(L.graph, L.bind);
    if (sdpa_only) continue;
    for (const Unpack& u : L.layers) {
      if (pass == Pass::fwd) be_.merge(static_cast<const MergeSeg*>(u.segs), u.n);
      else be_.sum(static_cast<const SumSeg*>(u.segs), u.n);
    }
  }
  if (sdpa_only) return;
  for (const Launch& L : pp.launches[static_cast<std::size_t>(s)])
    be_.attention(L.kernel, L.p, h_.dim, h_.dv(), L.grid);
  for (const IndexRun& L : pp.index[static_cast<std::size_t>(s)])
    be_.index_attention(L.kernel, L.p, h_.dim, h_.dv(), L.grid);
}

double RankPipeline::time_compute(Pass pass, bool sdpa_only) {
  const PassPrep& pp = pass_[static_cast<int>(pass)];
  be_.synchronize();
  be_.recycle_events();
  const Event t0 = be_.record(StreamId::compute);
  for (const Instr& i : pp.program) {
    if (i.op != Op::compute) continue;
    const int s = i.stage;
    if (!sdpa_only && pass == Pass::bwd) {
      if (s == 0) be_.delta(local_.o, local_.d_o, local_.delta, rows_ * h_.hq, h_.dv());
      else received_delta(pp, s);
    }
    launch_stage(pass, s, sdpa_only);
  }
  const Event t1 = be_.record(StreamId::compute);
  be_.synchronize();
  return be_.elapsed_ms(t0, t1);
}

// Backward: rowsum(dO O) of the rows remote stage s received.
void RankPipeline::received_delta(const PassPrep& pp, int s) {
  const Stage& st = pp.stages[static_cast<std::size_t>(s - 1)];
  if (st.qo_rows <= 0) return;
  const i64 off = st.qo_off * pp.shape.q_heads;
  be_.delta(pp.rb.o + off * h_.dv(), pp.rb.d_o + off * h_.dv(), pp.rb.delta + off, st.qo_rows * pp.shape.q_heads,
            h_.dv());
}

// A stage's args; in the backward pass first the delta of the rows the stage
// received (stage 0's local rows: backward() computes theirs).
void RankPipeline::compute_stage(Pass pass, PassPrep& pp, int s) {
  if (pass == Pass::bwd && s > 0) received_delta(pp, s);
  launch_stage(pass, s, false);
}

// Pass end: the returned partials into the rank's own rows (one launch per
// peer: two peers may return the same local rows).
void RankPipeline::merge_returns(Pass pass, const PassPrep& pp) {
  for (const Stage& st : pp.stages) {
    for (const Unpack& u : st.qo_unpack) {
      if (pass == Pass::fwd) be_.merge(static_cast<const MergeSeg*>(u.segs), u.n);
      else be_.sum(static_cast<const SumSeg*>(u.segs), u.n);
    }
    for (const Unpack& u : st.kv_unpack) be_.sum(static_cast<const SumSeg*>(u.segs), u.n);
  }
}

// Interprets the pass's program (plan/program.hpp): casts and reduces on the
// comm stream, args on the compute stream, events between them.
void RankPipeline::run_pass(Pass pass) {
  PassPrep& pp = pass_[static_cast<int>(pass)];
  const std::size_t N = pp.stages.size();
  PassRun run;
  run.cast_done.resize(N + 1);
  run.wired.assign(2 * N, -1);
  for (const Instr& i : pp.program) {
    switch (i.op) {
      case Op::cast: issue_cast(pp, i.stage, i.phase, run); break;
      case Op::wait_cast: be_.wait(StreamId::compute, run.cast_done[static_cast<std::size_t>(i.stage)]); break;
      case Op::compute:
        compute_stage(pass, pp, i.stage);
        ++run.computes;
        break;
      case Op::reduce: issue_reduce(pass, pp, i, run); break;
      case Op::wait_reduces:
        for (Event e : run.reduce_done) be_.wait(StreamId::compute, e);
        break;
      case Op::merge: merge_returns(pass, pp); break;
    }
  }
}

void RankPipeline::forward() {
  // A new iteration: the previous one's events (its timings read by now)
  // go back to the pool, so a run creates one iteration's worth of events.
  be_.recycle_events();
  PassPrep& pp = pass_[0];
  const i64 nq = rows_ * h_.hq;
  be_.fill(local_.o_acc, nq * h_.dv(), 0.f);
  be_.fill(local_.lse_acc, nq, neg_inf());
  const i64 rq = pp.shape.qo_rows * pp.shape.q_heads;
  be_.fill(pp.rb.o_acc, rq * h_.dv(), 0.f);
  be_.fill(pp.rb.lse_acc, rq, neg_inf());
  pp.t0 = be_.record(StreamId::compute);
  be_.wait(StreamId::comm, pp.t0);
  run_pass(Pass::fwd);
  be_.convert(local_.o_acc, local_.o, nq * h_.dv());  // the backward's O
  pp.t1 = be_.record(StreamId::compute);
}

void RankPipeline::backward() {
  PassPrep& pp = pass_[1];
  const i64 nq = rows_ * h_.hq * h_.dim, nk = rows_ * h_.hkv * h_.dim;
  const i64 dv = h_.shared ? 0 : h_.dv();  // a shared latent's dV is inside dK
  be_.fill(local_.dq_acc, nq, 0.f);
  be_.fill(local_.dk_acc, nk, 0.f);
  be_.fill(local_.dv_acc, rows_ * h_.hkv * dv, 0.f);
  be_.fill(pp.rb.dq_acc, pp.shape.qo_rows * pp.shape.q_heads * h_.dim, 0.f);
  be_.fill(pp.rb.dk_acc, pp.shape.kv_rows * pp.shape.kv_heads * h_.dim, 0.f);
  be_.fill(pp.rb.dv_acc, pp.shape.kv_rows * pp.shape.kv_heads * dv, 0.f);
  pp.t0 = be_.record(StreamId::compute);
  be_.delta(local_.o, local_.d_o, local_.delta, rows_ * h_.hq, h_.dv());
  // The casts read O and lse of the forward pass (compute stream).
  be_.wait(StreamId::comm, pp.t0);
  run_pass(Pass::bwd);
  pp.t1 = be_.record(StreamId::compute);
}

RankOutputs RankPipeline::outputs() {
  RankOutputs out;
  const auto nq = static_cast<std::size_t>(rows_ * h_.hq), nk = static_cast<std::size_t>(rows_ * h_.hkv);
  const auto D = static_cast<std::size_t>(h_.dim), Dv = static_cast<std::size_t>(h_.dv());
  out.o.resize(nq * Dv);
  out.lse.resize(nq);
  out.dq.resize(nq * D);
  out.dk.resize(nk * D);                 // with a shared latent: its whole gradient
  out.dv.resize(h_.shared ? 0 : nk * Dv);
  auto get = [&](std::vector<float>& v, const float* p) {
    if (!v.empty()) be_.download(v.data(), p, static_cast<Bytes>(v.size() * 4));
  };
  get(out.o, local_.o_acc);
  get(out.lse, local_.lse_acc);
  get(out.dq, local_.dq_acc);
  get(out.dk, local_.dk_acc);
  get(out.dv, local_.dv_acc);
  return out;
}

}  // namespace cpsched::gpu
