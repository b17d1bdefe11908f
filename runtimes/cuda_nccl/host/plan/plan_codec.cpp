#include "plan_codec.hpp"

#include <cstring>
#include <fmt/format.h>
#include <type_traits>

#include "cpsched/base/error.hpp"

namespace cpsched::gpu {

namespace {

constexpr std::uint32_t kMagic = 0x43505250;  // "CPRP"
constexpr std::uint32_t kVersion = 3;  // 2: forwarding phases (relays); 3: index args and their pool

class Writer {
 public:
  template <class T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  template <class Xs>  // a std::vector or an IndexPool
  void vec(const Xs& v) {
    pod(static_cast<std::uint64_t>(v.size()));
    for (const auto& x : v) item(x);
  }
  void item(std::int32_t x) { pod(x); }
  void item(std::int64_t x) { pod(x); }
  void item(const Range& r) {
    pod(r.begin);
    pod(r.end);
  }
  void item(const AttnArg& a) {
    item(a.q);
    item(a.k);
    pod(static_cast<std::int32_t>(a.type));
    pod(static_cast<std::uint8_t>(a.q_buf));
    pod(static_cast<std::uint8_t>(a.k_buf));
    pod(static_cast<std::int32_t>(a.group));
    pod(a.index_width);
    pod(a.index_offset);
    pod(a.index_area);
  }
  void item(const std::vector<Rank>& v) { vec(v); }
  void item(const std::vector<AttnArg>& v) { vec(v); }
  void item(const GroupCollectiveArg& g) {
    vec(g.input_split_sizes);
    vec(g.input_ranges);
    vec(g.input_groups);
    vec(g.dst_indices);
    vec(g.output_split_sizes);
    vec(g.src_index);
    vec(g.output_groups);
  }
  void item(const StageComm& s) {
    pod(s.num_remote_qo_tokens);
    pod(s.num_remote_kv_tokens);
    pod(s.qo_recv_offset);
    pod(s.kv_recv_offset);
    pod(static_cast<std::int32_t>(s.qo_reduce_after));
    pod(static_cast<std::int32_t>(s.kv_reduce_after));
    item(s.qo);
    item(s.kv);
    item(s.qo_fwd);
    item(s.kv_fwd);
  }
  void item(const Instr& i) {
    pod(static_cast<std::uint8_t>(i.op));
    pod(static_cast<std::int32_t>(i.stage));
    pod(static_cast<std::uint8_t>(i.kind));
    pod(static_cast<std::uint8_t>(i.phase));
  }
  void item(const PassPlan& p) {
    vec(p.calc.local_attn_args);
    vec(p.calc.remote_attn_args);
    vec(p.calc.indices);
    vec(p.comm.stages);
    vec(p.program);
  }
  std::vector<std::uint8_t> out;
};

class Reader {
 public:
  explicit Reader(const std::vector<std::uint8_t>& b) : b_(b) {}
  template <class T>
  T pod() {
    static_assert(std::is_trivially_copyable_v<T>);
    if (at_ + sizeof(T) > b_.size())
      throw Error(fmt::format("cuda_nccl: plan blob of {} bytes is truncated at byte {}", b_.size(), at_));
    T v;
    std::memcpy(&v, b_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  std::size_t count() {
    const auto n = pod<std::uint64_t>();
    if (n > b_.size()) throw Error(fmt::format("cuda_nccl: plan blob announces {} items in {} bytes", n, b_.size()));
    return static_cast<std::size_t>(n);
  }
  template <class T, class F>
  std::vector<T> vec(F&& one) {
    std::vector<T> v(count());
    for (T& x : v) x = one();
    return v;
  }
  Range range() {
    Range r;
    r.begin = pod<Token>();
    r.end = pod<Token>();
    return r;
  }
  AttnArg arg() {
    AttnArg a;
    a.q = range();
    a.k = range();
    const auto t = pod<std::int32_t>();
    if (t < 0 || t > 3) throw Error(fmt::format("cuda_nccl: plan blob holds mask type {}", t));
    a.type = static_cast<MaskType>(t);
    a.q_buf = static_cast<BufferId>(pod<std::uint8_t>() != 0);
    a.k_buf = static_cast<BufferId>(pod<std::uint8_t>() != 0);
    a.group = pod<std::int32_t>();
    a.index_width = pod<std::int32_t>();
    a.index_offset = pod<std::int64_t>();
    a.index_area = pod<Token>();
    if (a.index_width < 0 || a.index_offset < 0 || a.index_area < 0)
      throw Error(fmt::format("cuda_nccl: plan blob holds an index arg of width {} at offset {} with area {}",
                              a.index_width, a.index_offset, a.index_area));
    return a;
  }
  std::vector<AttnArg> args() { return vec<AttnArg>([&] { return arg(); }); }
  GroupCollectiveArg collective() {
    GroupCollectiveArg g;
    g.input_split_sizes = vec<Token>([&] { return pod<Token>(); });
    g.input_ranges = vec<Range>([&] { return range(); });
    g.input_groups = vec<int>([&] { return pod<std::int32_t>(); });
    g.dst_indices = vec<std::vector<Rank>>([&] { return vec<Rank>([&] { return pod<Rank>(); }); });
    g.output_split_sizes = vec<Token>([&] { return pod<Token>(); });
    g.src_index = vec<Rank>([&] { return pod<Rank>(); });
    g.output_groups = vec<int>([&] { return pod<std::int32_t>(); });
    return g;
  }
  StageComm stage() {
    StageComm s;
    s.num_remote_qo_tokens = pod<Token>();
    s.num_remote_kv_tokens = pod<Token>();
    s.qo_recv_offset = pod<Token>();
    s.kv_recv_offset = pod<Token>();
    s.qo_reduce_after = pod<std::int32_t>();
    s.kv_reduce_after = pod<std::int32_t>();
    s.qo = collective();
    s.kv = collective();
    s.qo_fwd = collective();
    s.kv_fwd = collective();
    return s;
  }
  // (Values out of range are caught by program_error where the pipeline takes the program.)
  Instr instr() {
    Instr i;
    i.op = static_cast<Op>(pod<std::uint8_t>());
    i.stage = pod<std::int32_t>();
    i.kind = static_cast<RowKind>(pod<std::uint8_t>());
    i.phase = static_cast<Phase>(pod<std::uint8_t>());
    return i;
  }
  PassPlan pass() {
    PassPlan p;
    p.calc.local_attn_args = args();
    p.calc.remote_attn_args = vec<std::vector<AttnArg>>([&] { return args(); });
    p.calc.indices = IndexPool(vec<std::int32_t>([&] { return pod<std::int32_t>(); }));
    p.comm.stages = vec<StageComm>([&] { return stage(); });
    p.program = vec<Instr>([&] { return instr(); });
    return p;
  }
  bool done() const { return at_ == b_.size(); }

 private:
  const std::vector<std::uint8_t>& b_;
  std::size_t at_ = 0;
};

}  // namespace

std::vector<std::uint8_t> encode_rank_plan(const RankPlan& p, int num_stages) {
  Writer w;
  w.pod(kMagic);
  w.pod(kVersion);
  w.pod(static_cast<std::int32_t>(num_stages));
  w.item(p.fwd);
  w.item(p.bwd);
  return std::move(w.out);
}

RankPlan decode_rank_plan(const std::vector<std::uint8_t>& bytes, int* num_stages) {
  Reader r(bytes);
  if (r.pod<std::uint32_t>() != kMagic) throw Error("cuda_nccl: the received bytes are not a cpsched rank plan");
  const auto v = r.pod<std::uint32_t>();
  if (v != kVersion) throw Error(fmt::format("cuda_nccl: rank plan format {} (this build reads {})", v, kVersion));
  const auto n = r.pod<std::int32_t>();
  RankPlan p;
  p.fwd = r.pass();
  p.bwd = r.pass();
  if (!r.done()) throw Error(fmt::format("cuda_nccl: {} trailing bytes after the rank plan", bytes.size()));
  if (num_stages != nullptr) *num_stages = n;
  return p;
}

}  // namespace cpsched::gpu
