#pragma once
// A task's compute under a profile's kernel model (kernel_model.hpp): the
// args the plan builder makes of it, priced one by one. A task's args do not
// depend on the rank computing it (each is an entry of a ragged batch,
// anchored at its own origin), so its kernel seconds are fixed per grid:
// solvers read them instead of area x seconds per pair. A stage's call costs
// depend on what else the rank computes there and are left to the timing
// model.
#include <memory>
#include <vector>

#include "cpsched/problem/task_grid.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/hardware/kernel_model.hpp"

namespace cpsched {

// The args of task t as the plan builder makes them before cutting any at a
// discontinuity of its buffers (relays' forwarded rows): each piece of its
// cell clipped to its blocks, as tight slices (plan/calc.cpp). A token top-k
// task (index args, built from the selection itself) is summarised as one
// arg of its cell's rows, its pairs and a width of pairs / rows rounded up
// (its plan cuts it per row run and pads each to its widest row).
void task_kernel_args(const TaskGrid& g, TaskId t, std::vector<KernelArg>& out);

// FLOPs per unmasked pair of one task's arg in pass p (the task's q heads),
// as the timing model counts them.
double task_flops_per_pair(const Problem& problem, bool one_group, Pass p);

// Per unit of the grid (a cell, or a task where groups have their own cells:
// search::ByteModel::unit_of), the kernel seconds of one task's args, entry
// costs included, forward, backward and both; and per pass what a price
// sheet adds of them to a stage (KernelStage::add_task): the held forms'
// femtoseconds, the other forms' area, the held forms present.
struct TaskKernelSeconds {
  std::vector<double> fwd, bwd, both;
  struct Stage {
    std::int64_t femtos = 0;  // the held forms' args
    Token unheld = 0;         // the other forms' area
    std::uint32_t forms = 0;  // bit f: an arg of held form f
  };
  std::vector<Stage> stage[2];  // [pass][unit]
  bool per_task = false;  // units are tasks (per-group cells), else cells
  int groups = 1;
  std::size_t unit_of(TaskId t) const {
    return per_task ? static_cast<std::size_t>(t) : static_cast<std::size_t>(t) / static_cast<std::size_t>(groups);
  }
};

// Null when `hw` has no kernel model (`hw` must be the profile a plan is
// priced on: the table, its peaks). O(cells x pieces) the first time for a
// grid's content and profile; the last few are kept (by a hash of what they
// depend on: the heads, and each cell's pieces and blocks), so that the
// solvers and the pricing of one solve share them. Thread safe.
std::shared_ptr<const TaskKernelSeconds> task_kernel_seconds(const TaskGrid& g, const HardwareProfile& hw);

}  // namespace cpsched
