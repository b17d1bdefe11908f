#pragma once
// The schedule of one pass on one rank, as data: the ordered program every
// executor interprets (the timing model, the sim, cuda_nccl, cpsched.torch).
// None of them keeps a loop over stages of its own; changing the order here
// (or in a plan's `program`) changes what all of them run.
//
// Two streams run it. The comm stream issues the collectives in program
// order; the compute stream runs the args. A cast's forwarding phase (relays)
// leaves once its first phase has arrived; a reduce's forwarding phase
// (partials back to the relays, merged there) precedes its first phase.
//
// The default program of N remote stages (pass_program):
//   cast(1, first), cast(1, forwarding)
//   compute(0)                          stage 0: local args, while cast(1) flies
//   for s = 1..N:
//     wait_cast(s)                      the compute stream waits for both phases
//     cast(s + 1, ...)                  (s < N) in flight while stage s computes
//     compute(s)
//     for every stage t <= s and kind whose *_reduce_after is s:
//       reduce(t, kind, forwarding), reduce(t, kind, first)
//   wait_reduces                        every reduce issued has arrived
//   merge                               the returned partials into the rank's rows
//
// The forwarding-phase instructions are always present; an executor skips
// one whose collective moves nothing (plans without relays).
// docs/plan_format.md ("program") gives the JSON form; docs/architecture.md
// shows who reads it.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cpsched/base/pass.hpp"
#include "cpsched/base/row_kind.hpp"

namespace cpsched {

struct StageComm;

enum class Op : std::uint8_t {
  cast,          // issue stage's group-cast (both kinds) of `phase`
  wait_cast,     // the compute stream waits for stage's casts (both phases)
  compute,       // run stage's args (0: the local ones)
  reduce,        // issue the group-reduce of stage's `kind` partials, `phase`
  wait_reduces,  // the compute stream waits for every reduce issued
  merge,         // fold the returned partials into the rank's own rows
};
enum class Phase : std::uint8_t { first = 0, forwarding = 1 };

struct Instr {
  Op op = Op::compute;
  int stage = 0;               // cast, wait_cast, reduce: 1..N; compute: 0..N; wait_reduces, merge: N
  RowKind kind = RowKind::qo;  // reduce only
  Phase phase = Phase::first;  // cast and reduce only
  friend bool operator==(const Instr&, const Instr&) = default;
};

using Program = std::vector<Instr>;

// The default program of a pass whose stage-t outputs of each kind go back
// after stage qo_after[t - 1] / kv_after[t - 1] (StageComm::*_reduce_after;
// 0 or out of [t, N]: after the last stage). The forward pass reduces QO
// only (K and V have no forward outputs).
Program pass_program(int num_stages, std::span<const int> qo_after, std::span<const int> kv_after, Pass pass);
// The same from a rank's stages.
Program pass_program(const std::vector<StageComm>& stages, Pass pass);

// Why `p` is not a runnable program of its pass (empty: it is): each stage
// cast once per phase (first, then forwarding) before it is waited for,
// waited for before it is computed, stages computed once each in order, each
// (stage, kind) reduced once per phase (forwarding, then first) no earlier
// than after its *_reduce_after stage (later is allowed: the reduce still
// sees every contribution), then wait_reduces and merge, last. The forward
// pass reduces no KV.
std::string program_error(const Program& p, int num_stages, std::span<const int> qo_after,
                          std::span<const int> kv_after, Pass pass);
std::string program_error(const Program& p, const std::vector<StageComm>& stages, Pass pass);

std::string_view to_string(Op op);
std::string_view to_string(Phase ph);
// "cast 2 first", "compute 0", "reduce 1 qo forwarding", "merge 3": for
// messages and tests.
std::string to_string(const Instr& i);

}  // namespace cpsched
