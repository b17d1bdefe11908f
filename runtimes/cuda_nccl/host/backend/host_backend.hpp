#pragma once
// The CPU emulation of a GPU rank: the kernels are the CTA programs run by
// host_exec.hpp, device memory is host memory, NCCL calls move bytes between
// rank threads through a HostWorld, and the two streams are queues whose
// order is enforced exactly as on a GPU: an operation runs only after the
// earlier operations of its stream and the events it waits for.
//
// The schedule decides when queued work runs. `eager` runs everything at
// once (program order). `lazy_comm` runs the comm stream only when something
// waits for it, and `lazy_compute` the same for the compute stream: a missing
// event wait in the pipeline then reads data that has not arrived or sends
// data not yet computed, and the numbers go wrong — the CPU tests run all
// three schedules to prove the pipeline's ordering, not just its arithmetic.
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend.hpp"

namespace cpsched::gpu {

// Mailboxes between the rank threads of one emulated run. Sends never block;
// a receive blocks until the matching send (same pair, FIFO) and fails when
// the sizes differ, as an NCCL pair with mismatched counts would corrupt.
class HostWorld {
 public:
  explicit HostWorld(int ranks) : ranks_(ranks) {}
  int ranks() const { return ranks_; }
  void send(Rank src, Rank dst, const void* p, Bytes n);
  void recv(Rank dst, Rank src, void* p, Bytes n);  // throws cpsched::Error
  void abort(const std::string& why);               // wakes every receiver with an error

 private:
  int ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<Rank, Rank>, std::deque<std::vector<std::uint8_t>>> box_;
  std::string aborted_;
};

enum class Schedule { eager, lazy_comm, lazy_compute };

class HostBackend : public Backend {
 public:
  HostBackend(HostWorld& world, Rank rank, Schedule schedule = Schedule::eager);
  ~HostBackend() override;

  Rank rank() const override { return rank_; }
  int world() const override { return world_.ranks(); }
  std::string describe() const override;

  void* alloc(Bytes bytes) override;
  void release(void* p) override;
  void upload(void* dst, const void* src, Bytes n) override;
  void download(void* dst, const void* src, Bytes n) override;

  std::string kernel_dims_lack(int dim, int dim_v, bool shared, bool range_args) const override;
  void attention(AttnKernel k, const AttnLaunch& p, int dim, int dim_v, Grid g) override;
  void index_attention(IndexKernel k, const IndexLaunch& p, int dim, int dim_v, Grid g) override;
  void copy(StreamId s, const CopySeg* segs, int n) override;
  void merge(const MergeSeg* segs, int n) override;
  void sum(const SumSeg* segs, int n) override;
  void convert(const float* src, bf16* dst, i64 n) override;
  void fill(float* dst, i64 n, float value) override;
  void delta(const bf16* o, const bf16* d_o, float* out, i64 row_heads, int dim) override;
  void exchange(const std::vector<P2POp>& ops) override;

  // SDPA graphs run on the CPU twin (sdpa_twin.hpp).
  std::string sdpa_support() const override { return ""; }
  int sdpa_prepare(const SdpaGeometry& g) override;
  void sdpa_run(int graph, const SdpaBind& b) override;
  SdpaStats sdpa_stats() const override { return {static_cast<int>(graphs_.size()), 0, 0}; }

  Event record(StreamId s) override;
  void recycle_events() override { next_event_ = 0; }
  int events_created() const override { return static_cast<int>(events_.size()); }
  void wait(StreamId s, Event e) override;
  void synchronize() override;
  double elapsed_ms(Event, Event) override { return 0.0; }

  std::int64_t kernels_run() const { return kernels_; }
  // Device bytes allocated now (what `release` gave back is not counted).
  Bytes bytes_held() const { return held_; }
  int allocations() const { return allocations_; }

 private:
  struct Op {
    std::function<void()> fn;
    int wait_stream = -1;
    std::int64_t wait_pos = 0;
  };
  void enqueue(StreamId s, Op op);
  void drain(int s, std::int64_t upto);
  void after_enqueue();

  HostWorld& world_;
  Rank rank_;
  Schedule schedule_;
  std::vector<std::unique_ptr<std::uint8_t[]>> blocks_;
  std::deque<Op> queue_[2];
  std::int64_t issued_[2] = {0, 0};
  std::int64_t done_[2] = {0, 0};
  bool busy_[2] = {false, false};
  std::vector<std::pair<int, std::int64_t>> events_;  // pool: (stream, position)
  std::size_t next_event_ = 0;                        // events_[0, next) are in use
  std::map<const void*, Bytes> sizes_;                // of live blocks
  Bytes held_ = 0;
  int allocations_ = 0;
  std::int64_t kernels_ = 0;
  std::vector<SdpaGeometry> graphs_;
};

}  // namespace cpsched::gpu
