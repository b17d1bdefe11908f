#pragma once
// What the timing model reads of a plan, and nothing more: per pass, each
// rank's attention area per stage (and, made for a profile with a kernel
// model, its kernel seconds per stage) and, for every collective, the tokens it
// sends to and receives from each peer. PlanBuilder::price_sheet makes one
// to price a placement at a plan shape without building the plan: no args,
// no splits, no row ranges, one entry per (phase, kind, stage, sender,
// receiver). The timing model gives it the step it gives the plan the
// builder would make with the same options (timing/model.hpp), to the last
// bit (with a kernel model, its args cut where a relay's forwarded rows land
// apart, as the plan's; except token top-k args under a model that holds
// the index form, priced per cell: hardware/task_kernel.hpp). It cannot be
// executed.
#include <cstdint>
#include <optional>
#include <vector>

#include "cpsched/base/range.hpp"
#include "cpsched/problem/problem.hpp"
#include "cpsched/hardware/profile.hpp"

namespace cpsched {

struct PriceSheet {
  // Tokens moved to or from one peer in one part of a collective.
  struct Split {
    Token tokens = 0;
    Rank peer = 0;
  };
  struct Pass {
    // [r * (stages + 1) + s]: rank r's attention area (query-key pairs) in
    // stage s (0: local).
    std::vector<Token> area;
    // [r * (stages + 1) + s]: its kernel seconds (args, entries and calls)
    // under `kernel`; empty when the sheet was made without one.
    std::vector<double> kernel;
    // [s - 1]: the last stage reading rows received in stage s (the same on
    // every rank, as StageComm::*_reduce_after).
    std::vector<int> qo_reduce_after, kv_reduce_after;
    // Parts: a rank's (stage, kind, phase) of a collective, indexed by
    // part(r, s, kind, phase). Its splits sent are send[send_begin[i],
    // send_begin[i + 1]) (peer: the receiver), received recv[...] likewise
    // (peer: the sender), in the order a plan's GroupCollectiveArg lists
    // them: one split per peer.
    std::vector<std::int32_t> send_begin, recv_begin;
    std::vector<Split> send, recv;
    bool has_forwarding = false;  // some part of phase 1 (relays' forwarding) moves tokens
  };
  int ranks = 0;           // P
  int stages = 0;          // remote stages N, the local tail included (Plan::num_stages)
  bool local_tail = false;
  bool flattened = true;   // head groups flattened: an area counts the task's q heads, else all
  // The kernel model the kernel seconds were priced with, and the profile's
  // attention_tflops (forms the model does not hold): the sheet prices on
  // profiles with the same (kernel_for).
  std::optional<KernelModel> kernel;
  double peak_tflops[2] = {0, 0};
  Pass fwd, bwd;

  bool kernel_for(const HardwareProfile& hw) const {
    return kernel.has_value() == hw.kernel.has_value() && (!kernel || (*kernel == *hw.kernel &&
           peak_tflops[0] == hw.fwd_tflops && peak_tflops[1] == hw.bwd_tflops));
  }

  // Phase 0: the first phase; 1: relays' forwarding. kind: index_of(RowKind).
  std::size_t part(Rank r, int stage, int kind, int phase) const { return part_of(stages, r, stage, kind, phase); }
  static std::size_t part_of(int stages, Rank r, int stage, int kind, int phase) {
    return ((static_cast<std::size_t>(r) * static_cast<std::size_t>(stages) + static_cast<std::size_t>(stage - 1)) *
                2 + static_cast<std::size_t>(kind)) * 2 + static_cast<std::size_t>(phase);
  }
  std::size_t parts() const { return static_cast<std::size_t>(ranks) * static_cast<std::size_t>(stages) * 4; }
  bool has_forwarding() const { return fwd.has_forwarding || bwd.has_forwarding; }
};

}  // namespace cpsched
