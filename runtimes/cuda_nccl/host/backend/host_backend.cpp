#include "host_backend.hpp"

#include <type_traits>

#include <algorithm>
#include <cstring>
#include <limits>
#include <fmt/format.h>

#include "host/programs/attention_programs.hpp"
#include "cpsched/base/error.hpp"
#include "host/programs/data_programs.hpp"
#include "host/programs/host_exec.hpp"
#include "host/programs/index_programs.hpp"
#include "sdpa_twin.hpp"

namespace cpsched::gpu {

// ------------------------------------------------------------------ world

void HostWorld::send(Rank src, Rank dst, const void* p, Bytes n) {
  std::vector<std::uint8_t> msg(static_cast<std::size_t>(n));
  if (n > 0) std::memcpy(msg.data(), p, static_cast<std::size_t>(n));
  {
    std::lock_guard lock(mu_);
    box_[{src, dst}].push_back(std::move(msg));
  }
  cv_.notify_all();
}

void HostWorld::recv(Rank dst, Rank src, void* p, Bytes n) {
  std::unique_lock lock(mu_);
  auto& q = box_[{src, dst}];
  cv_.wait(lock, [&] { return !q.empty() || !aborted_.empty(); });
  if (!aborted_.empty()) throw Error(fmt::format("rank {}: aborted while receiving from rank {} ({})", dst, src, aborted_));
  std::vector<std::uint8_t> msg = std::move(q.front());
  q.pop_front();
  lock.unlock();
  if (static_cast<Bytes>(msg.size()) != n)
    throw Error(fmt::format("rank {} expected {} bytes from rank {} but {} were sent", dst, n, src, msg.size()));
  if (n > 0) std::memcpy(p, msg.data(), static_cast<std::size_t>(n));
}

void HostWorld::abort(const std::string& why) {
  {
    std::lock_guard lock(mu_);
    if (aborted_.empty()) aborted_ = why.empty() ? "another rank failed" : why;
  }
  cv_.notify_all();
}

// ------------------------------------------------------------------ backend

HostBackend::HostBackend(HostWorld& world, Rank rank, Schedule schedule)
    : world_(world), rank_(rank), schedule_(schedule) {}

HostBackend::~HostBackend() = default;

std::string HostBackend::describe() const {
  static constexpr const char* kNames[] = {"eager", "lazy_comm", "lazy_compute"};
  return fmt::format("CPU emulation, rank {} of {}, schedule {}", rank_, world_.ranks(),
                     kNames[static_cast<int>(schedule_)]);
}

void* HostBackend::alloc(Bytes bytes) {
  if (bytes <= 0) return nullptr;
  blocks_.push_back(std::make_unique<std::uint8_t[]>(static_cast<std::size_t>(bytes)));  // zeroed
  sizes_[blocks_.back().get()] = bytes;
  held_ += bytes;
  ++allocations_;
  return blocks_.back().get();
}

void HostBackend::release(void* p) {
  if (p == nullptr) return;
  const auto it = std::find_if(blocks_.begin(), blocks_.end(), [&](const auto& b) { return b.get() == p; });
  if (it == blocks_.end()) throw Error(fmt::format("rank {}: release of memory this backend did not allocate", rank_));
  // No work may be pending on it, as with cudaFree after a synchronize.
  synchronize();
  held_ -= sizes_.at(p);
  sizes_.erase(p);
  blocks_.erase(it);
}

void HostBackend::upload(void* dst, const void* src, Bytes n) {
  synchronize();
  if (n > 0) std::memcpy(dst, src, static_cast<std::size_t>(n));
}

void HostBackend::download(void* dst, const void* src, Bytes n) {
  synchronize();
  if (n > 0) std::memcpy(dst, src, static_cast<std::size_t>(n));
}

namespace {

// The head dims the CPU emulation has kernels for: GQA (d_qk = d_v) 16, 32,
// 64, 128; MLA 576 / 512 (DeepSeek's latent, configs/dsa.yaml) and 48 / 32
// (the same geometry, small enough for CI).
template <class F>
bool with_dims(int dim, int dim_v, F&& f) {
  if (dim == dim_v) {
    switch (dim) {
      case 16: f(std::integral_constant<int, 16>{}, std::integral_constant<int, 16>{}); return true;
      case 32: f(std::integral_constant<int, 32>{}, std::integral_constant<int, 32>{}); return true;
      case 64: f(std::integral_constant<int, 64>{}, std::integral_constant<int, 64>{}); return true;
      case 128: f(std::integral_constant<int, 128>{}, std::integral_constant<int, 128>{}); return true;
      default: return false;
    }
  }
  if (dim == 576 && dim_v == 512) {
    f(std::integral_constant<int, 576>{}, std::integral_constant<int, 512>{});
    return true;
  }
  if (dim == 48 && dim_v == 32) {
    f(std::integral_constant<int, 48>{}, std::integral_constant<int, 32>{});
    return true;
  }
  return false;
}

std::string host_dims_lack(int dim, int dim_v, const char* what) {
  if (with_dims(dim, dim_v, [](auto, auto) {})) return "";
  return fmt::format("cuda_nccl: head dims d_qk {} / d_v {} have no {} (the CPU emulation has GQA 16, 32, 64, 128 "
                     "and MLA 576 / 512, 48 / 32)",
                     dim, dim_v, what);
}

void check_host_dims(int dim, int dim_v, const char* what) {
  const std::string why = host_dims_lack(dim, dim_v, what);
  if (!why.empty()) throw Error(why);
}

// Index programs: MT (16-head tiles) by the query heads per kv head and the
// head dim (index_mt), and the shared latent's variant (MLA dims only).
template <int DQ, int DV, bool kLatent>
void run_index_as(IndexKernel k, const IndexLaunch& p, Grid g) {
  const int mt = index_mt(p.hq / p.hkv, DQ);
  constexpr int kWide = DQ > 256 ? 2 : 4;
  switch (k) {
    case IndexKernel::fwd:
      if (mt > 1) run_on_host(IndexFwdProgram<DQ, DV, kWide, kLatent>{p}, g.x, g.y);
      else run_on_host(IndexFwdProgram<DQ, DV, 1, kLatent>{p}, g.x, g.y);
      return;
    case IndexKernel::dq:
      if (mt > 1) run_on_host(IndexDqProgram<DQ, DV, kWide, kLatent>{p}, g.x, g.y);
      else run_on_host(IndexDqProgram<DQ, DV, 1, kLatent>{p}, g.x, g.y);
      return;
    case IndexKernel::dkdv: run_on_host(IndexDkvProgram<DQ, DV, kLatent>{p}, g.x, g.y); return;
  }
}

template <int DQ, int DV>
void run_index(IndexKernel k, const IndexLaunch& p, Grid g) {
  if constexpr (DQ != DV) {
    if (p.latent != 0) return run_index_as<DQ, DV, true>(k, p, g);
  } else {
    if (p.latent != 0) throw Error("cuda_nccl: a shared latent with d_v = d_qk has no index kernel");
  }
  run_index_as<DQ, DV, false>(k, p, g);
}

template <int DQ, int DV>
void run_attention(AttnKernel k, const AttnLaunch& p, Grid g) {
  switch (k) {
    case AttnKernel::fwd: run_on_host(FwdProgram<DQ, DV>{p}, g.x, g.y); return;
    case AttnKernel::dq: run_on_host(DqProgram<DQ, DV>{p}, g.x, g.y); return;
    case AttnKernel::dkdv: run_on_host(DkvProgram<DQ, DV>{p}, g.x, g.y); return;
  }
}

}  // namespace

std::string HostBackend::kernel_dims_lack(int dim, int dim_v, bool shared, bool) const {
  if (shared && dim == dim_v)
    return fmt::format("cuda_nccl: a shared latent with d_v = d_qk ({}) has no kernel (MLA's latent has d_v < d_qk)",
                       dim);
  return host_dims_lack(dim, dim_v, "kernel");
}

void HostBackend::index_attention(IndexKernel k, const IndexLaunch& p, int dim, int dim_v, Grid g) {
  if (g.x == 0 || g.y == 0) return;
  check_host_dims(dim, dim_v, "index kernel");
  enqueue(StreamId::compute, {[=, this] {
            ++kernels_;
            with_dims(dim, dim_v, [&](auto dq, auto dv) { run_index<decltype(dq)::value, decltype(dv)::value>(k, p, g); });
          }});
}

void HostBackend::attention(AttnKernel k, const AttnLaunch& p, int dim, int dim_v, Grid g) {
  if (g.x == 0 || g.y == 0) return;
  check_host_dims(dim, dim_v, "kernel");
  enqueue(StreamId::compute, {[=, this] {
            ++kernels_;
            with_dims(dim, dim_v,
                      [&](auto dq, auto dv) { run_attention<decltype(dq)::value, decltype(dv)::value>(k, p, g); });
          }});
}

void HostBackend::copy(StreamId s, const CopySeg* segs, int n) {
  if (n == 0) return;
  enqueue(s, {[=, this] {
            ++kernels_;
            run_on_host(CopyProgram{segs}, n);
          }});
}

void HostBackend::merge(const MergeSeg* segs, int n) {
  if (n == 0) return;
  enqueue(StreamId::compute, {[=, this] {
            ++kernels_;
            run_on_host(MergeProgram{segs}, n);
          }});
}

void HostBackend::sum(const SumSeg* segs, int n) {
  if (n == 0) return;
  enqueue(StreamId::compute, {[=, this] {
            ++kernels_;
            run_on_host(SumProgram{segs}, n);
          }});
}

void HostBackend::convert(const float* src, bf16* dst, i64 n) {
  if (n == 0) return;
  enqueue(StreamId::compute, {[=, this] {
            ++kernels_;
            const int c = grid_stride_ctas(n);
            run_on_host(ConvertProgram{src, dst, n, c}, c);
          }});
}

void HostBackend::fill(float* dst, i64 n, float value) {
  if (n == 0) return;
  enqueue(StreamId::compute, {[=, this] {
            ++kernels_;
            const int c = grid_stride_ctas(n);
            run_on_host(FillProgram{dst, n, value, c}, c);
          }});
}

void HostBackend::delta(const bf16* o, const bf16* d_o, float* out, i64 row_heads, int dim) {
  if (row_heads == 0) return;
  enqueue(StreamId::compute, {[=, this] {
            ++kernels_;
            const int c = grid_stride_ctas(row_heads);
            run_on_host(DeltaProgram{o, d_o, out, row_heads, dim, c}, c);
          }});
}

int HostBackend::sdpa_prepare(const SdpaGeometry& g) {
  for (std::size_t i = 0; i < graphs_.size(); ++i)
    if (graphs_[i] == g) return static_cast<int>(i);
  graphs_.push_back(g);
  return static_cast<int>(graphs_.size()) - 1;
}

void HostBackend::sdpa_run(int graph, const SdpaBind& b) {
  if (graph < 0 || static_cast<std::size_t>(graph) >= graphs_.size())
    throw Error(fmt::format("rank {}: SDPA graph {} was never prepared", rank_, graph));
  enqueue(StreamId::compute, {[g = graphs_[static_cast<std::size_t>(graph)], b, this] {
            ++kernels_;
            sdpa_twin(g, b);
          }});
}

void HostBackend::exchange(const std::vector<P2POp>& ops) {
  if (ops.empty()) return;
  enqueue(StreamId::comm, {[ops, this] {
            // A group: every send is posted before any receive blocks.
            for (const P2POp& op : ops)
              if (op.send) world_.send(rank_, op.peer, op.ptr, op.bytes);
            for (const P2POp& op : ops)
              if (!op.send) world_.recv(rank_, op.peer, op.ptr, op.bytes);
          }});
}

Event HostBackend::record(StreamId s) {
  const std::pair<int, std::int64_t> at{static_cast<int>(s), issued_[static_cast<int>(s)]};
  if (next_event_ == events_.size()) events_.push_back(at);
  else events_[next_event_] = at;
  return Event{static_cast<int>(next_event_++)};
}

void HostBackend::wait(StreamId s, Event e) {
  if (e.id < 0 || static_cast<std::size_t>(e.id) >= next_event_)
    throw Error(fmt::format("rank {}: wait on event {} that is not recorded (recycled?)", rank_, e.id));
  const auto [stream, pos] = events_[static_cast<std::size_t>(e.id)];
  if (stream == static_cast<int>(s)) return;  // a stream is ordered with itself
  enqueue(s, {nullptr, stream, pos});
}

void HostBackend::enqueue(StreamId s, Op op) {
  queue_[static_cast<int>(s)].push_back(std::move(op));
  ++issued_[static_cast<int>(s)];
  after_enqueue();
}

void HostBackend::after_enqueue() {
  constexpr std::int64_t kAll = std::numeric_limits<std::int64_t>::max();
  switch (schedule_) {
    case Schedule::eager:
      drain(0, kAll);
      drain(1, kAll);
      break;
    case Schedule::lazy_comm: drain(0, kAll); break;
    case Schedule::lazy_compute: drain(1, kAll); break;
  }
}

void HostBackend::drain(int s, std::int64_t upto) {
  // Re-entering a stream that is already draining means the two streams
  // wait for each other: a hang on a GPU.
  if (busy_[s]) throw Error(fmt::format("rank {}: the two streams wait for each other", rank_));
  busy_[s] = true;
  struct Reset {
    bool& b;
    ~Reset() { b = false; }
  } reset{busy_[s]};
  while (done_[s] < upto && !queue_[s].empty()) {
    Op& op = queue_[s].front();
    if (op.wait_stream >= 0 && done_[op.wait_stream] < op.wait_pos) {
      const int ws = op.wait_stream;
      const std::int64_t pos = op.wait_pos;
      drain(ws, pos);
      if (done_[ws] < pos)
        throw Error(fmt::format("rank {}: the two streams wait for each other", rank_));
    }
    std::function<void()> fn = std::move(op.fn);
    queue_[s].pop_front();
    if (fn) fn();
    ++done_[s];
  }
}

void HostBackend::synchronize() {
  constexpr std::int64_t kAll = std::numeric_limits<std::int64_t>::max();
  while (!queue_[0].empty() || !queue_[1].empty()) {
    drain(0, kAll);
    drain(1, kAll);
  }
}

}  // namespace cpsched::gpu
