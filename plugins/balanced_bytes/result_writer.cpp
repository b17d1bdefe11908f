// The time mode's result: one Outcome (planner.hpp) of whichever path, its
// figures (for tools) and its note (for people: how it was found).
#include "planner.hpp"
#include "time_mode.hpp"

#include <cstdio>

#include "cpsched/search/placements.hpp"

namespace cpsched::search {

namespace {

std::string ms(double s) { return num(s * 1e3, "%.3f"); }

// The full path's account of its plans after the predicted step.
std::string full_how(const Outcome& o, const Options& opt) {
  if (!o.compute_bound) return "by the search's model (grid above member_max_tasks: no plan priced)";
  return "of " + std::to_string(o.candidates) + " candidates (" + std::to_string(o.plans) + " plans priced, " +
         std::to_string(o.skipped_by_bound) + " skipped by their step bound" +
         (o.settled ? "; within " + num(100 * opt.settle) + " % of the compute bound" : "") +
         (o.settled_early ? ", so no member grid was searched" : "") + ")";
}

// The quick path's: what was priced, what was taken unpriced, and why no full search ran.
std::string quick_how(const Outcome& o, const SolveInput& in) {
  std::string how = o.compute_bound ? std::to_string(o.plans) + " plans priced" : "by the search's model";
  if (o.stages_unpriced) how += o.one_node ? ", 2 stages unpriced" : ", 2 stages and the ports' cut unpriced";
  if (o.relay_unpriced > 0)
    how += ", relays on nodes of " + std::to_string(o.relay_unpriced) + " (not priced against none)";
  return how + "; planned for " + in.uses().str() + " use(s): no full search (" + ms(o.full_cost) +
         " ms of planning predicted, more than it is expected to save)";
}

// The note up to the phases' remarks: the placement, its shape, its step and how it was found.
std::string headline(const Outcome& o, const SolveInput& in, const Options& opt) {
  std::string note = "balanced_bytes (time): " + o.best.origin + " on " +
                     std::to_string(o.best.grid->problem().grid.blocks_per_rank) + " block(s) per rank, " +
                     std::to_string(o.shape.stages) + " stage(s)";
  switch (o.path) {
    case TimePath::full:
      if (o.relay > 0) note += ", relays on nodes of " + std::to_string(o.relay);
      return note + ", predicted step " + num(o.step * 1e3, "%.4f") + " ms " + full_how(o, opt);
    case TimePath::quick:
      return note + ", predicted step " + ms(o.step) + (o.stages_unpriced ? " ms at 1 stage " : " ms ") +
             quick_how(o, in);
    case TimePath::huge:
      break;
  }
  return note + ", predicted step " + ms(o.step) + " ms by the search's model; planned for " + in.uses().str() +
         " use(s) on a grid above member_max_tasks: the starts and the best balanced by rows, no search";
}

void set_figures(Figures& f, const Outcome& o) {
  const bool full = o.path == TimePath::full;
  f.set("predicted_step_s", o.step);
  if (o.compute_bound) f.set("compute_bound_s", *o.compute_bound);
  if (!full || o.compute_bound) {
    f.set("candidates", static_cast<double>(o.candidates));
    f.set("plans_priced", static_cast<double>(o.plans));
  }
  if (full && o.compute_bound) f.set("plans_skipped_by_bound", static_cast<double>(o.skipped_by_bound));
  f.set("stages", o.shape.stages);
  if (full) {
    f.set("full_search", 1);
    f.set("settled", o.settled ? 1 : 0);
  }
  f.set("relay_node_size", o.relay);
  f.set("blocks_per_rank", o.best.grid->problem().grid.blocks_per_rank);
  if (!full) f.set("full_search", 0);
  if (o.input_grid_step) f.set("input_grid_step_s", *o.input_grid_step);
}

// Under a kernel model, made ahead: the plan priced fastest under it replaces
// the one chosen on exact areas (`areas_step`, kernel_pick.hpp); the note says which.
void take_kernel_pick(Solution& sol, const AreasFirstPricing::Priced& p, double areas_step, double mu) {
  char buf[200];
  if (p.today) {
    std::snprintf(buf, sizeof buf, "; under the kernel model its step is %.4f ms, the fastest of the plans priced",
                  p.prices.kernels.step * 1e3);
  } else {
    std::snprintf(buf, sizeof buf,
                  "; under the kernel model another plan priced is faster, taken: %.4f ms (%d block(s) per rank, "
                  "%d stage(s); %.4f ms on exact areas)",
                  p.prices.kernels.step * 1e3, p.grid->problem().grid.blocks_per_rank, p.shape.stages,
                  p.prices.areas.step * 1e3);
  }
  sol.assignment.grid = p.grid;
  sol.assignment.rank = *p.rank;
  sol.shape = p.shape;
  sol.feasible = balance_cap(*p.grid, mu) >= max_load(*p.grid, *p.rank);
  sol.figures.set("stages", p.shape.stages);
  sol.figures.set("relay_node_size", p.shape.relay_node_size());
  sol.figures.set("blocks_per_rank", p.grid->problem().grid.blocks_per_rank);
  sol.note += buf;
  sol.figures.set("areas_step_s", areas_step);
  sol.figures.set("predicted_step_s", p.prices.kernels.step);
  sol.figures.set("compute_bound_s", p.prices.kernels.compute_bound);
}

}  // namespace

// mu caps the search; plans are judged by their step time alone (a rank above
// the cap is priced in it), and the result says whether it meets mu.
Solution write_result(Outcome o, const SolveInput& in, const Options& opt) {
  Solution sol;
  const TaskGrid& grid = *o.best.grid;
  sol.feasible = balance_cap(grid, opt.mu) >= max_load(grid, o.best.rank);
  const bool within_cap =
      o.cap_mu == opt.mu ? sol.feasible : balance_cap(grid, o.cap_mu) >= max_load(grid, o.best.rank);
  sol.shape = o.shape;
  set_figures(sol.figures, o);
  sol.note = headline(o, in, opt) + o.remarks;
  if (!within_cap)
    sol.note += (o.path == TimePath::full ? "; the fastest plan is above mu = " : "; the chosen plan is above mu = ") +
                num(o.cap_mu);
  sol.note += o.repeats;
  sol.assignment.grid = o.best.grid;
  sol.assignment.rank = std::move(o.best.rank);
  if (o.kernel_pick) take_kernel_pick(sol, *o.kernel_pick, o.step, opt.mu);
  sol.note += o.closing;
  return sol;
}

}  // namespace cpsched::search
