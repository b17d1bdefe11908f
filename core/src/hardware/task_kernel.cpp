#include "cpsched/hardware/task_kernel.hpp"

#include <algorithm>
#include <cstring>
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

// What a unit's kernel seconds are a function of, hashed: the heads' FLOPs
// per pair and grouping, and per unit its cell's pieces and blocks (index
// cells: rows, cols, pairs). A cache keyed by it holds nothing of the grid or
// its problem (whose shared state a plugin may have made: a plugin's code
// must not be called after it is unloaded, at exit or earlier).
std::uint64_t fingerprint(const TaskGrid& g) {
  std::uint64_t h = 0x9e3779b97f4a7c15ULL;
  auto mix = [&](std::uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 31;
  };
  auto mixd = [&](double d) {
    std::uint64_t u;
    std::memcpy(&u, &d, sizeof u);
    mix(u);
  };
  const Problem& p = g.problem();
  for (Pass pass : {Pass::fwd, Pass::bwd}) mixd(task_flops_per_pair(p, g.flattened(), pass));
  mix(static_cast<std::uint64_t>(g.num_groups()));
  mix(g.per_group_cells() ? 1 : 0);
  mix(g.index_cells() ? 1 : 0);
  const std::size_t units = g.per_group_cells() ? static_cast<std::size_t>(g.num_tasks()) : g.cells().size();
  mix(units);
  const auto G = static_cast<std::size_t>(g.num_groups());
  const Sharding& sh = g.sharding();
  for (std::size_t u = 0; u < units; ++u) {
    const Cell& c = g.cell_of(static_cast<TaskId>(g.per_group_cells() ? u : u * G));
    if (g.index_cells()) {
      mix(static_cast<std::uint64_t>(c.rows.size()));
      mix(static_cast<std::uint64_t>(c.cols.size()));
      mix(static_cast<std::uint64_t>(c.area));
      continue;
    }
    for (const Range r : {sh.blocks[static_cast<std::size_t>(c.qblock)], sh.blocks[static_cast<std::size_t>(c.kblock)]}) {
      mix(static_cast<std::uint64_t>(r.begin));
      mix(static_cast<std::uint64_t>(r.end));
    }
    mix(c.pieces.size());
    for (const Slice& x : c.pieces) {
      mix(static_cast<std::uint64_t>(x.q.begin));
      mix(static_cast<std::uint64_t>(x.q.end));
      mix(static_cast<std::uint64_t>(x.k.begin));
      mix(static_cast<std::uint64_t>(x.k.end));
      mix(static_cast<std::uint64_t>(x.type));
    }
  }
  return h;
}

struct Entry {
  std::uint64_t grid = 0;  // fingerprint()
  std::size_t units = 0;
  HardwareProfile hw;
  std::shared_ptr<const TaskKernelSeconds> seconds;
};

}  // namespace

std::shared_ptr<const TaskKernelSeconds> task_kernel_seconds(const TaskGrid& g, const HardwareProfile& hw) {
  if (!hw.kernel) return nullptr;
  static std::mutex mu;
  static std::vector<Entry> cache;  // most recent last
  constexpr std::size_t kEntries = 8;
  const std::uint64_t key = fingerprint(g);
  const std::size_t units = g.per_group_cells() ? static_cast<std::size_t>(g.num_tasks()) : g.cells().size();
  {
    std::lock_guard<std::mutex> lock(mu);
    for (std::size_t i = cache.size(); i-- > 0;) {
      const Entry& e = cache[i];
      if (e.grid == key && e.units == units && *e.hw.kernel == *hw.kernel && e.hw.fwd_tflops == hw.fwd_tflops &&
          e.hw.bwd_tflops == hw.bwd_tflops)
        return e.seconds;
    }
  }
  std::shared_ptr<const TaskKernelSeconds> s = compute(g, hw);
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() >= kEntries) cache.erase(cache.begin());
  cache.push_back({key, units, hw, s});
  return s;
}

}  // namespace cpsched
