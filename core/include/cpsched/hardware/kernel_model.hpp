#pragma once
// The kernel model of a hardware profile (configs/hardware/*.yaml, key
// `kernel`): how long the fused attention kernels take on an arg, as they
// compute it, per pass.
//
//  * Tiles. A kernel computes whole tiles of tile_q query rows x tile_k key
//    columns, anchored at the arg's first row and column (each arg is one
//    entry of a ragged batch): a tile with one unmasked entry costs a whole
//    tile. An index arg (token top-k, FlashMLA's [s_q, topk] layout) is
//    tiled over its rows and its padded index width.
//  * Rates. Per mask form (full, causal, inv_causal, bi_causal, index) a
//    table of TFLOP/s by length, as published or measured: on one arg of
//    L x L of that form (bi_causal: L x 2L, a band of L + 1 keys per query;
//    index: L rows x L index entries), FLOPs counted on its exact area
//    (4 x area x heads x D forward, 2.5 x that backward). The model turns
//    each point into a rate per tile FLOP (the same time for that arg counted
//    in tiles) and interpolates those linearly in log2(length), clamped to
//    the table's ends. The length of an arg is the extent of the kernel's
//    inner loop: its key columns forward (index: its index width), its query
//    rows backward, where the kernels loop over q tiles per key tile.
//  * Fixed costs. call_us per kernel call, entry_us per batch entry (arg).
//    The runtimes batch per (stage, pass, q buffer, k buffer, mask form): the
//    cuDNN path makes one ragged SDPA call per such batch, cpsched.torch's
//    flash path one varlen call; so a stage of a rank pays one call per
//    distinct (q buffer, k buffer, form) among its args.
// An arg takes  tiles x tile_q x tile_k x FLOPs per pair / tile rate
// + entry_us;  a stage adds call_us per call. A form the table does not hold
// is priced as without a kernel model: its exact area at the profile's
// attention_tflops, no fixed cost, no call.
#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

#include "cpsched/base/buffer_id.hpp"
#include "cpsched/base/pass.hpp"
#include "cpsched/base/range.hpp"
#include "cpsched/mask/mask.hpp"

namespace cpsched {

enum class KernelForm : int { full = 0, causal = 1, inv_causal = 2, bi_causal = 3, index = 4 };
inline constexpr int kKernelForms = 5;
std::string_view to_string(KernelForm f);
inline KernelForm kernel_form(MaskType t) { return static_cast<KernelForm>(static_cast<int>(t)); }

// Tiles of tile_q x tile_k (anchored at the arg's origin) holding at least
// one unmasked entry of a q_len x k_len arg of mask type `type` (mask.hpp's
// semantics). O(log) (closed forms).
std::int64_t tiles_touched(MaskType type, Token q_len, Token k_len, int tile_q, int tile_k);
// Tiles of an index arg of `rows` rows padded to `width` index entries.
std::int64_t index_tiles(Token rows, std::int64_t width, int tile_q, int tile_k);

// An arg as the kernel model reads it.
struct KernelArg {
  KernelForm form = KernelForm::full;
  Token q_len = 0;          // query rows
  Token k_len = 0;          // key columns (range args)
  Token area = 0;           // unmasked (query, key) pairs per head
  std::int64_t width = 0;   // index args: the padded index width
};

// The kernel model of one pass.
struct KernelRates {
  int tile_q = 0, tile_k = 0;
  double call_us = 0;    // per kernel call
  double entry_us = 0;   // per batch entry (arg)
  std::vector<double> lengths;                          // ascending, > 0
  std::array<std::vector<double>, kKernelForms> tflops; // per form: TFLOP/s at lengths[i] (empty: not held)
  std::array<int, kKernelForms> alias{-1, -1, -1, -1, -1};  // >= 0: the form takes that form's row
  // Rates per tile FLOP at each length (finish()); per form, after aliases.
  std::array<std::vector<double>, kKernelForms> tile_tflops;
  std::array<std::vector<double>, kKernelForms> area_tflops;
  std::vector<double> log2_lengths;  // finish(): log2 of each length

  // Resolves the aliases and derives the tile rates. Throws cpsched::Error
  // (without a location: the parser adds it) on an inconsistent table.
  void finish();
  bool holds(KernelForm f) const { return !tile_tflops[static_cast<std::size_t>(f)].empty(); }
  // TFLOP/s per tile FLOP (tiles) or per exact FLOP (area) at `length`.
  double tile_rate(KernelForm f, double length) const;
  double area_rate(KernelForm f, double length) const;
  friend bool operator==(const KernelRates&, const KernelRates&) = default;
};

struct KernelModel {
  KernelRates fwd, bwd;
  // false: args are priced on their exact area at the area rates (the same
  // rates and fixed costs, no tile rounding): what tiles cost, measured.
  bool count_tiles = true;

  const KernelRates& pass(Pass p) const { return p == Pass::fwd ? fwd : bwd; }
  // Seconds of one arg in pass p, its entry cost included (no call cost).
  // flops_per_pair: the pass's FLOPs per unmasked pair over the arg's heads;
  // peak_tflops: the profile's attention_tflops of the pass (forms not held).
  double arg_seconds(Pass p, const KernelArg& a, double flops_per_pair, double peak_tflops) const;
  // Whether an arg of form f opens a call (forms the table holds).
  bool calls(Pass p, KernelForm f) const { return pass(p).holds(f) && pass(p).call_us > 0; }
  double call_seconds(Pass p) const { return pass(p).call_us * 1e-6; }
  friend bool operator==(const KernelModel&, const KernelModel&) = default;
};

// The calls of one stage: a set of (q buffer, k buffer, form).
class KernelCalls {
 public:
  void add(BufferId q, BufferId k, KernelForm f) { add_forms(q, k, 1u << static_cast<unsigned>(f)); }
  // Every form of `forms` (bit f: form f).
  void add_forms(BufferId q, BufferId k, std::uint32_t forms) {
    bits_ |= forms << ((static_cast<unsigned>(q) * 2 + static_cast<unsigned>(k)) * kKernelForms);
  }
  int count() const { return __builtin_popcount(bits_); }

 private:
  std::uint32_t bits_ = 0;
};

// An arg's seconds in whole femtoseconds: sums of them are exact, so a
// stage's total does not depend on how its args are grouped (a price sheet
// adds a task's args at once, a plan one by one).
inline std::int64_t kernel_femtos(double seconds) { return std::llround(seconds * 1e15); }

// One stage's compute under a kernel model: the args of forms the model
// holds, each in whole femtoseconds; the others' exact area, priced once at
// the peak; then the calls. The timing model prices a plan's stages and a
// price sheet's with it, to the same bits.
class KernelStage {
 public:
  // fpp: FLOPs per pair over the args' heads in pass p (the same for all of
  // a stage's args); peak_tflops: the profile's rate of the pass.
  KernelStage(const KernelModel& km, Pass p, double fpp, double peak_tflops)
      : km_(&km), pass_(p), fpp_(fpp), peak_(peak_tflops) {}
  void add(const KernelArg& a, BufferId q, BufferId k) {
    if (!km_->pass(pass_).holds(a.form)) {
      unheld_ += a.area;
      return;
    }
    femtos_ += kernel_femtos(km_->arg_seconds(pass_, a, fpp_, peak_));
    calls_.add(q, k, a.form);
  }
  // A task's args at once: their femtoseconds and unheld area, and the held
  // forms among them (bit f: form f).
  void add_task(std::int64_t femtos, Token unheld, std::uint32_t held_forms, BufferId q, BufferId k) {
    femtos_ += femtos;
    unheld_ += unheld;
    calls_.add_forms(q, k, held_forms);
  }
  double seconds() const {
    return static_cast<double>(femtos_) * 1e-15 + static_cast<double>(unheld_) * fpp_ / (peak_ * 1e12) +
           calls_.count() * km_->call_seconds(pass_);
  }

 private:
  const KernelModel* km_;
  Pass pass_;
  double fpp_, peak_;
  std::int64_t femtos_ = 0;
  Token unheld_ = 0;
  KernelCalls calls_;
};

}  // namespace cpsched
