// The time mode's entry: the planner on the prices as they are, or under a
// kernel model on exact areas first (kernel_pick.hpp).
#include "balanced_bytes.hpp"
#include "kernel_pick.hpp"
#include "planner.hpp"
#include "time_mode.hpp"

#include <cpsched/search/members.hpp>

#include <numeric>
#include <optional>
#include <string>
#include <string_view>

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

// The member whose own placement `c` is (as the member returned it, on its
// own grid), "" for any other candidate.
std::string member_of(const Candidate& c) {
  constexpr std::string_view on_grid = "-grid:";  // full_time.cpp: "<member>-grid:<origin on its grid>"
  if (c.searched) return "";
  const std::size_t at = c.origin.find(on_grid);
  if (at == std::string::npos) return c.origin;
  const std::string name = c.origin.substr(0, at);
  return c.origin.substr(at + on_grid.size()) == name ? name : "";
}

// Made ahead, where today's pick is static's dispatch as it is: the same
// member's dispatch cut at the kernels' tiles both ways (static's tile_cuts:
// the deal made on the cuts at tiles, and today's deal with its cuts moved),
// priced at today's shape, so that the kernels' pick sees them too.
void price_static_at_tiles(const Outcome& today, const SolveInput& in, MemberSolvers& members,
                           AreasFirstPricing& areas, Token tile) {
  const std::string name = member_of(today.best);
  if (tile < 2 || name.rfind("static", 0) != 0) return;
  const std::string spec =
      name + (name.find(':') == std::string::npos ? ":" : "+") + "tile_tokens=" + std::to_string(tile);
  const PlanShape shape = in.shape().resolve(today.shape);
  for (const char* cuts : {"before", "after"}) {
    std::string why;
    std::optional<Solution> s = members.solve(spec + "+tile_cuts=" + std::string(cuts), in, why);
    if (s) areas.price_both(areas.add(s->assignment.grid, std::move(s->assignment.rank)), shape);
  }
}

}  // namespace

// Under a kernel model: today's plan, every decision on the profile without
// its table (kernel_pick.hpp). Used a few times, at today's cost, with
// static's dispatch on one node cut at the kernels' tiles; made ahead, the
// fastest under the kernel model of the plans it priced (static's pick cut at
// tiles both ways among them), and of the search on the kernels' seconds
// (docs/bounds.md#the-default-solvers-phase-constants).
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
  price_static_at_tiles(today, in, members, areas, kernel_tile_tokens(*in.time_prices()->kernel));
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
