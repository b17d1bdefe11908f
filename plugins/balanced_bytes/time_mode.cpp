// The time mode's entry: the planner on the prices as they are, or under a
// kernel model on exact areas first (kernel_pick.hpp).
#include "balanced_bytes.hpp"
#include "kernel_pick.hpp"
#include "planner.hpp"
#include "time_mode.hpp"

#include <numeric>
#include <optional>

namespace cpsched::search {

namespace {

// The tokens every tile side of both passes divides (static's tile_tokens), 0 without a kernel model.
Token kernel_tile_tokens(const HardwareProfile& hw) {
  if (!hw.kernel) return 0;
  const KernelModel& k = *hw.kernel;
  Token tile = 1;
  for (const int t : {k.fwd.tile_q, k.fwd.tile_k, k.bwd.tile_q, k.bwd.tile_k})
    if (t > 0) tile = std::lcm(tile, Token{t});
  return tile > 1 ? tile : 0;
}

}  // namespace

// Under a kernel model: today's plan, every decision on the profile without
// its table (kernel_pick.hpp). Used a few times, at today's cost, with
// static's dispatch on one node cut at the kernels' tiles; made ahead, the
// fastest under the kernel model of the plans it priced, and of the search on
// the kernels' seconds (docs/bounds.md#the-default-solvers-phase-constants).
Solution BalancedBytes::solve_time(const SolveInput& in) const {
  MemberSolvers& members = *members_;
  if (!in.time_prices()->kernel) return write_result(TimePlanner(in, opt_, members, opt_.mu, 0).run(), in, opt_);
  const bool ahead = in.uses().planning_weight() <= 0;
  AreasFirstPricing areas(*in.pricing(), ahead);
  TimePrices flat = *in.time_prices();
  flat.kernel.reset();
  SolveInput on_areas(in);
  on_areas.with_time_prices(flat).with_pricing(&areas);
  if (!ahead) {
    const bool one_node = in.grid()->cp_size() <= in.time_prices()->nodes.gpus_per_node;
    const Token tile = one_node ? kernel_tile_tokens(*in.time_prices()->kernel) : 0;
    Outcome o = TimePlanner(on_areas, opt_, members, opt_.mu, tile).run();
    o.closing = "; decided on exact areas (the profile's kernel model prices the plan built)";
    return write_result(std::move(o), in, opt_);
  }
  Outcome today = TimePlanner(on_areas, opt_, members, opt_.mu, 0).run();
  today.kernel_pick = areas.fastest_on_kernels(today.best.grid, today.best.rank, today.shape, in.shape());
  if (!today.kernel_pick) return write_result(std::move(today), in, opt_);
  // Made ahead (the time is hidden): the search on the kernels' seconds too,
  // and the faster of the two plans under the kernel model.
  Outcome k = TimePlanner(in, opt_, members, opt_.mu, 0).run();
  const double pick_step = today.kernel_pick->prices.kernels.step;
  if (k.compute_bound && k.step < pick_step) {
    k.closing = "; faster than the plan searched on exact areas (" + num(pick_step * 1e3, "%.4f") +
                " ms under the kernel model)";
    return write_result(std::move(k), in, opt_);
  }
  today.closing = "; the search on the kernels' seconds found no faster plan (" + num(k.step * 1e3, "%.4f") + " ms)";
  return write_result(std::move(today), in, opt_);
}

}  // namespace cpsched::search
