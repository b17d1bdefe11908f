#include "cuda_backend.hpp"

#include <algorithm>
#include <cstring>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>
#include <vector>

#include "cpsched/base/error.hpp"
#include "cudnn_sdpa.hpp"
#include "kernels.hpp"

namespace cpsched::gpu {

namespace {

void check(cudaError_t e, const char* what) { cuda::check(e, what); }

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(fmt::format("cuda_nccl: {}: {}", what, ncclGetErrorString(r)));
}

int visible_devices() {
  const int n = cuda_device_count();
  if (n == 0) throw Error("cuda_nccl: no CUDA device is visible (cudaGetDeviceCount found none)");
  return n;
}

class CudaBackendImpl final : public Backend {
 public:
  explicit CudaBackendImpl(Bootstrap& bs) : info_(bs.info()) {
    open_device(info_.local_rank % visible_devices());
    if (info_.world > 1) {
      ncclUniqueId id{};
      std::vector<std::uint8_t> bytes(sizeof id);
      if (info_.rank == 0) {
        check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
        std::memcpy(bytes.data(), &id, sizeof id);
      }
      bs.broadcast(bytes);
      if (bytes.size() != sizeof id)
        throw Error(fmt::format("cuda_nccl: rank {} received a {}-byte NCCL id, expected {}", info_.rank, bytes.size(),
                                sizeof id));
      std::memcpy(&id, bytes.data(), sizeof id);
      check_nccl(ncclCommInitRank(&comm_, info_.world, id, info_.rank), "ncclCommInitRank");
      bs.done();
    }
  }

  CudaBackendImpl(HostWorld& world, Rank rank, int device) : loopback_(&world) {
    info_ = LaunchInfo{rank, world.ranks(), device, "loopback"};
    const int n = visible_devices();
    if (device >= n) throw Error(fmt::format("cuda_nccl loopback: device {} is not visible ({} device(s))", device, n));
    open_device(device);
  }

  ~CudaBackendImpl() override {
    // Best effort: a destructor must not throw.
    sdpa_.reset();
    cudaStreamSynchronize(stream_[0]);
    cudaStreamSynchronize(stream_[1]);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    for (void* p : blocks_) cudaFree(p);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_[0]);
    cudaStreamDestroy(stream_[1]);
  }

  Rank rank() const override { return info_.rank; }
  int world() const override { return info_.world; }
  std::string describe() const override {
    return fmt::format("rank {} of {} on GPU {} ({}), launch {}", info_.rank, info_.world, device_, name_, info_.how);
  }

  void* alloc(Bytes bytes) override {
    if (bytes <= 0) return nullptr;
    void* p = nullptr;
    check(cudaMalloc(&p, static_cast<std::size_t>(bytes)), "cudaMalloc");
    blocks_.push_back(p);
    check(cudaMemset(p, 0, static_cast<std::size_t>(bytes)), "cudaMemset");
    // The memset runs on the legacy stream, which the non-blocking streams do
    // not wait for: finish it before anything can use the memory.
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(alloc)");
    return p;
  }
  void release(void* p) override {
    if (p == nullptr) return;
    const auto it = std::find(blocks_.begin(), blocks_.end(), p);
    if (it == blocks_.end()) throw Error("cuda_nccl: release of memory this backend did not allocate");
    synchronize();  // no stream work may still use it
    blocks_.erase(it);
    check(cudaFree(p), "cudaFree");
  }
  void upload(void* dst, const void* src, Bytes n) override {
    synchronize();
    if (n > 0) check(cudaMemcpy(dst, src, static_cast<std::size_t>(n), cudaMemcpyHostToDevice), "cudaMemcpy(upload)");
  }
  void download(void* dst, const void* src, Bytes n) override {
    synchronize();
    if (n > 0) check(cudaMemcpy(dst, src, static_cast<std::size_t>(n), cudaMemcpyDeviceToHost), "cudaMemcpy(download)");
  }

  std::string kernel_dims_lack(int dim, int dim_v, bool shared, bool range_args) const override {
    return cuda::kernel_dims_lack(dim, dim_v, shared, range_args);
  }
  void attention(AttnKernel k, const AttnLaunch& p, int dim, int dim_v, Grid g) override {
    cuda::attention(k, p, dim, dim_v, g, stream_[0]);
  }
  void index_attention(IndexKernel k, const IndexLaunch& p, int dim, int dim_v, Grid g) override {
    cuda::index_attention(k, p, dim, dim_v, g, stream_[0]);
  }
  void copy(StreamId s, const CopySeg* segs, int n) override { cuda::copy(segs, n, stream(s)); }
  void merge(const MergeSeg* segs, int n) override { cuda::merge(segs, n, stream_[0]); }
  void sum(const SumSeg* segs, int n) override { cuda::sum(segs, n, stream_[0]); }
  void convert(const float* src, bf16* dst, i64 n) override { cuda::convert(src, dst, n, stream_[0]); }
  void fill(float* dst, i64 n, float value) override { cuda::fill(dst, n, value, stream_[0]); }
  void delta(const bf16* o, const bf16* d_o, float* out, i64 row_heads, int dim) override {
    cuda::delta(o, d_o, out, row_heads, dim, stream_[0]);
  }

  std::string sdpa_support() const override { return sdpa_lacks_; }
  int sdpa_prepare(const SdpaGeometry& g) override {
    if (!sdpa_) throw Error("cuda_nccl: SDPA graph on a device without cuDNN: " + sdpa_lacks_);
    return sdpa_->prepare(g);
  }
  void sdpa_run(int graph, const SdpaBind& b) override {
    if (!sdpa_) throw Error("cuda_nccl: SDPA run on a device without cuDNN: " + sdpa_lacks_);
    sdpa_->run(graph, b);
  }
  SdpaStats sdpa_stats() const override { return sdpa_ ? sdpa_->stats() : SdpaStats{}; }

  void exchange(const std::vector<P2POp>& ops) override {
    if (ops.empty()) return;
    if (loopback_ != nullptr) return exchange_via_host(ops);
    if (comm_ == nullptr) throw Error("cuda_nccl: point-to-point transfer in a one-rank run");
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (const P2POp& op : ops) {
      const auto n = static_cast<std::size_t>(op.bytes);
      if (op.send) check_nccl(ncclSend(op.ptr, n, ncclUint8, op.peer, comm_, stream_[1]), "ncclSend");
      else check_nccl(ncclRecv(op.ptr, n, ncclUint8, op.peer, comm_, stream_[1]), "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  }

  Event record(StreamId s) override {
    // From the pool; a new event only when every pooled one is in use. A
    // re-record does not disturb waits enqueued before it (cudaStreamWaitEvent
    // binds to the record current at the time of the call).
    if (next_event_ == events_.size()) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreate(&e), "cudaEventCreate");
      events_.push_back(e);
    }
    const std::size_t id = next_event_++;
    check(cudaEventRecord(events_[id], stream(s)), "cudaEventRecord");
    return Event{static_cast<int>(id)};
  }
  void recycle_events() override { next_event_ = 0; }
  int events_created() const override { return static_cast<int>(events_.size()); }
  void wait(StreamId s, Event e) override {
    check(cudaStreamWaitEvent(stream(s), event(e), 0), "cudaStreamWaitEvent");
  }
  void synchronize() override {
    check(cudaStreamSynchronize(stream_[0]), "cudaStreamSynchronize(compute)");
    check(cudaStreamSynchronize(stream_[1]), "cudaStreamSynchronize(comm)");
    if (comm_ != nullptr) {
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
      check_nccl(async, "NCCL asynchronous error");
    }
  }
  double elapsed_ms(Event a, Event b) override {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, event(a), event(b)), "cudaEventElapsedTime");
    return ms;
  }

 private:
  cudaStream_t stream(StreamId s) const { return stream_[static_cast<int>(s)]; }
  cudaEvent_t event(Event e) const {
    if (e.id < 0 || static_cast<std::size_t>(e.id) >= next_event_)
      throw Error(fmt::format("cuda_nccl (internal): event {} is not recorded (recycled?)", e.id));
    return events_[static_cast<std::size_t>(e.id)];
  }

  void open_device(int device) {
    device_ = device;
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_[0], cudaStreamNonBlocking), "cudaStreamCreate(compute)");
    check(cudaStreamCreateWithFlags(&stream_[1], cudaStreamNonBlocking), "cudaStreamCreate(comm)");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
    name_ = prop.name;
    // cuDNN's attention on the compute stream, where the build and the device have it.
    if (!cudnn::built()) {
      sdpa_lacks_ = cudnn::describe_build();
    } else if (prop.major < 8) {
      sdpa_lacks_ = fmt::format("cuDNN's SDPA needs compute capability 8.0 or newer, {} has {}.{}", name_, prop.major,
                                prop.minor);
    } else {
      try {
        sdpa_ = std::make_unique<cudnn::Runner>(stream_[0]);
      } catch (const Error& e) {
        sdpa_lacks_ = e.what();
      }
    }
  }

  // The comm stream's earlier work (and the events it waits for) first, then
  // the group: every send posted before any receive blocks, as in NCCL.
  void exchange_via_host(const std::vector<P2POp>& ops) {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaStreamSynchronize(stream_[1]), "cudaStreamSynchronize(comm)");
    std::vector<std::uint8_t> buf;
    for (const P2POp& op : ops)
      if (op.send) {
        buf.resize(static_cast<std::size_t>(op.bytes));
        check(cudaMemcpy(buf.data(), op.ptr, buf.size(), cudaMemcpyDeviceToHost), "cudaMemcpy(loopback send)");
        loopback_->send(info_.rank, op.peer, buf.data(), op.bytes);
      }
    for (const P2POp& op : ops)
      if (!op.send) {
        buf.resize(static_cast<std::size_t>(op.bytes));
        loopback_->recv(info_.rank, op.peer, buf.data(), op.bytes);
        check(cudaMemcpy(op.ptr, buf.data(), buf.size(), cudaMemcpyHostToDevice), "cudaMemcpy(loopback recv)");
      }
  }

  LaunchInfo info_;
  int device_ = 0;
  std::string name_;
  cudaStream_t stream_[2] = {nullptr, nullptr};
  ncclComm_t comm_ = nullptr;
  HostWorld* loopback_ = nullptr;
  std::vector<void*> blocks_;
  std::vector<cudaEvent_t> events_;  // the pool; [0, next_event_) recorded since the last recycle
  std::size_t next_event_ = 0;
  std::unique_ptr<cudnn::Runner> sdpa_;  // null: no cuDNN, and sdpa_lacks_ says why
  std::string sdpa_lacks_;
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver / no device" error
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_cuda_backend(Bootstrap& bootstrap) {
  return std::make_unique<CudaBackendImpl>(bootstrap);
}

std::unique_ptr<Backend> make_cuda_loopback_backend(HostWorld& world, Rank rank, int device) {
  return std::make_unique<CudaBackendImpl>(world, rank, device);
}

}  // namespace cpsched::gpu
