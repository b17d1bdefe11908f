#include "cpsched/timing/task_kernel.hpp"

#include <algorithm>
#include <mutex>

#include "cpsched/mask/slice_clip.hpp"

namespace cpsched {

void task_kernel_args(const TaskGrid& g, TaskId t, std::vector<KernelArg>& out) {
  out.clear();
  const Cell& c = g.cell_of(t);
  if (g.index_cells()) {
    const Token rows = c.rows.size();
    if (rows > 0 && c.area > 0)
      out.push_back({KernelForm::index, rows, c.cols.size(), c.area, (c.area + rows - 1) / rows});
    return;
  }
  const Sharding& sh = g.sharding();
  const Range qb = sh.blocks[static_cast<std::size_t>(c.qblock)];
  const Range kb = sh.blocks[static_cast<std::size_t>(c.kblock)];
  thread_local std::vector<Slice> tight;
  for (const Slice& s : c.pieces) {
    tight.clear();
    band_to_slices(clip(band_of(s), qb, kb), tight);
    for (const Slice& x : tight) out.push_back({kernel_form(x.type), x.q.size(), x.k.size(), slice_area(x), 0});
  }
}

double task_flops_per_pair(const Problem& problem, bool one_group, Pass p) {
  // As timing/model.cpp's area_flops: q heads x FLOPs per pair forward, the
  // backward ratio x that backward.
  const double qh = one_group ? problem.q_heads_per_task() : problem.heads.q;
  const double fwd = qh * problem.heads.fwd_flops_per_pair();
  return p == Pass::fwd ? fwd : problem.heads.bwd_flops_ratio() * fwd;
}

namespace {

std::shared_ptr<TaskKernelSeconds> compute(const TaskGrid& g, const HardwareProfile& hw) {
  const KernelModel& km = *hw.kernel;
  auto out = std::make_shared<TaskKernelSeconds>();
  out->per_task = g.per_group_cells();
  out->groups = g.num_groups();
  const std::size_t units = out->per_task ? static_cast<std::size_t>(g.num_tasks()) : g.cells().size();
  out->fwd.assign(units, 0.0);
  out->bwd.assign(units, 0.0);
  out->both.assign(units, 0.0);
  for (int p = 0; p < 2; ++p) {
    out->stage[p].assign(units, TaskKernelSeconds::Stage{});
  }
  const Problem& p = g.problem();
  const double fpp[2] = {task_flops_per_pair(p, g.flattened(), Pass::fwd),
                         task_flops_per_pair(p, g.flattened(), Pass::bwd)};
  std::vector<KernelArg> args;
  const auto G = static_cast<std::size_t>(g.num_groups());
  for (std::size_t u = 0; u < units; ++u) {
    const auto t = static_cast<TaskId>(out->per_task ? u : u * G);
    task_kernel_args(g, t, args);
    double f = 0, b = 0;
    for (const KernelArg& a : args) {
      f += km.arg_seconds(Pass::fwd, a, fpp[0], hw.fwd_tflops);
      b += km.arg_seconds(Pass::bwd, a, fpp[1], hw.bwd_tflops);
      for (int p = 0; p < 2; ++p) {
        const Pass pass = p == 0 ? Pass::fwd : Pass::bwd;
        if (!km.pass(pass).holds(a.form)) {
          out->stage[p][u].unheld += a.area;
          continue;
        }
        out->stage[p][u].femtos +=
            kernel_femtos(km.arg_seconds(pass, a, fpp[p], p == 0 ? hw.fwd_tflops : hw.bwd_tflops));
        out->stage[p][u].forms |= 1u << static_cast<unsigned>(a.form);
      }
    }
    out->fwd[u] = f;
    out->bwd[u] = b;
    out->both[u] = f + b;
  }
  return out;
}

// A grid is a function of its problem and sharding: the key. The problem is
// held weakly (an index mask's problem holds its indices), and while it lives
// no other problem has its address.
struct Entry {
  std::weak_ptr<const Problem> problem;
  Sharding sharding;
  HardwareProfile hw;
  std::shared_ptr<const TaskKernelSeconds> seconds;
};

bool same_sharding(const Sharding& a, const Sharding& b) {
  return a.cp_size == b.cp_size && a.blocks == b.blocks && a.host == b.host;
}

}  // namespace

std::shared_ptr<const TaskKernelSeconds> task_kernel_seconds(const TaskGrid& g, const HardwareProfile& hw) {
  if (!hw.kernel) return nullptr;
  static std::mutex mu;
  static std::vector<Entry> cache;  // most recent last
  constexpr std::size_t kEntries = 8;
  const std::shared_ptr<const Problem> problem = g.problem_ptr();
  {
    std::lock_guard<std::mutex> lock(mu);
    for (std::size_t i = cache.size(); i-- > 0;) {
      Entry& e = cache[i];
      const std::shared_ptr<const Problem> held = e.problem.lock();
      if (!held) {
        cache.erase(cache.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      if (held.get() == problem.get() && same_sharding(e.sharding, g.sharding()) && *e.hw.kernel == *hw.kernel &&
          e.hw.fwd_tflops == hw.fwd_tflops && e.hw.bwd_tflops == hw.bwd_tflops)
        return e.seconds;
    }
  }
  std::shared_ptr<const TaskKernelSeconds> s = compute(g, hw);
  if (!problem) return s;
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() >= kEntries) cache.erase(cache.begin());
  cache.push_back({problem, g.sharding(), hw, s});
  return s;
}

}  // namespace cpsched
