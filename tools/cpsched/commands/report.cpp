#include "commands/report.hpp"

#include <algorithm>
#include <fmt/format.h>

namespace cpsched::cli {

double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

namespace {
std::string dtype_name(int bytes) {
  switch (bytes) {
    case 1: return "fp8";
    case 2: return "bf16";
    case 4: return "fp32";
    default: return fmt::format("{}B", bytes);
  }
}
std::string mib(std::int64_t b) { return fmt::format("{:.1f}", static_cast<double>(b) / (1024.0 * 1024.0)); }
}  // namespace

void print_summary(std::FILE* out, const Config& cfg, const SolveResult& s) {
  const TaskGrid& grid = *s.assignment->grid;
  const Problem& p = grid.problem();
  // MLA (docs/heads.md) names d_qk, d_v and the shared latent; GQA's line is unchanged.
  const std::string dims = p.heads.is_gqa() ? fmt::format("D = {}", p.heads.dim)
                                            : fmt::format("d_qk = {}, d_v = {}{}", p.heads.dqk(), p.heads.dv(),
                                                          p.heads.kv_shared ? ", shared KV latent" : "");
  fmt::print(out, "problem   S = {} tokens ({} per rank), P = {}, heads {}:{}, {}, {}\n", p.seqlen(),
             cfg.seqlen_per_rank, p.cp_size(), p.heads.q, p.heads.kv, dims, dtype_name(p.heads.dtype_bytes));
  const double s2 = static_cast<double>(p.seqlen()) * static_cast<double>(p.seqlen());
  if (p.index_mask) {
    const IndexMask& m = *p.index_mask;
    std::string shape;
    for (std::int64_t d : m.indices.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    const double area = static_cast<double>(m.area());
    fmt::print(out, "mask      {}: token top-k [{}], {:.0f} selected pairs per head ({:.2f} % of S^2), {}\n",
               to_string(cfg.mask.kind), shape, area / m.kv_heads, 100.0 * area / m.kv_heads / s2,
               m.kv_heads > 1 ? "one selection per KV head" : "shared by all heads");
  } else if (!p.head_masks.empty()) {
    std::size_t slices = 0;
    double area = 0;
    for (const RangeMask& m : p.head_masks) {
      slices += m.slices().size();
      area += static_cast<double>(m.area());
    }
    const double n = static_cast<double>(p.head_masks.size());
    fmt::print(out, "mask      {}: block selection per KV head ({} heads), {} slices, {:.0f} pairs per head ({:.2f} % of S^2)\n",
               to_string(cfg.mask.kind), p.head_masks.size(), slices, area / n, 100.0 * area / n / s2);
  } else {
    fmt::print(out, "mask      {}: {} slices, area {} ({:.2f} % of S^2)\n", to_string(cfg.mask.kind),
               p.mask.slices().size(), p.mask.area(), 100.0 * static_cast<double>(p.mask.area()) / s2);
  }
  fmt::print(out, "grid      {} x {} blocks, {} head group(s){}, {} non-empty cells, {} tasks\n",
             grid.sharding().num_blocks(), grid.sharding().num_blocks(), grid.num_groups(),
             grid.flattened() ? " (flattened)" : "", grid.cells().size(), grid.num_tasks());
  fmt::print(out, "solver    {} in {:.2f} ms{}\n", cfg.solver.name, s.solve_ms,
             s.feasible ? "" : " — balance target not met");
  if (!s.note.empty()) fmt::print(out, "          {}\n", s.note);
}

void print_metrics_table(std::FILE* out, const SolveResult& s) {
  const Metrics& m = s.metrics;
  const Problem& p = s.assignment->grid->problem();
  const std::size_t P = m.load.size();
  const double mean_load = [&] {
    double t = 0;
    for (auto l : m.load) t += static_cast<double>(l);
    return P ? t / static_cast<double>(P) : 0.0;
  }();
  fmt::print(out, "\n{:>6}  {:>10}  {:>7}  {:>11}  {:>11}  {:>11}  {:>11}\n", "rank", "load/mean", "stage0",
             "fwd send", "fwd recv", "bwd send", "bwd recv");
  fmt::print(out, "{:>6}  {:>10}  {:>7}  {:>11}  {:>11}  {:>11}  {:>11}\n", "", "", "", "MiB", "MiB", "MiB", "MiB");
  // Long rank lists are elided in the middle; the totals below cover all ranks.
  for (std::size_t r = 0; r < P; ++r) {
    if (P > 16 && r == 8) fmt::print(out, "{:>6}\n", "...");
    if (P > 16 && r >= 8 && r < P - 8) continue;
    const double share = m.load[r] ? static_cast<double>(m.stage0_load[r]) / static_cast<double>(m.load[r]) : 1.0;
    fmt::print(out, "{:>6}  {:>10.3f}  {:>6.1f}%  {:>11}  {:>11}  {:>11}  {:>11}\n", r,
               mean_load > 0 ? static_cast<double>(m.load[r]) / mean_load : 1.0, 100.0 * share, mib(m.fwd.send[r]),
               mib(m.fwd.recv[r]), mib(m.bwd.send[r]), mib(m.bwd.recv[r]));
  }
  const int u = usp_ulysses_degree(p.cp_size(), p.heads.kv);
  const double usp_fwd = usp_closed_form_fwd_bytes_per_rank(p, u) * p.cp_size();
  auto reduction = [&](double v) { return usp_fwd > 0 ? 100.0 * (1.0 - v / usp_fwd) : 0.0; };
  fmt::print(out, "\n{:<34} {:>12} {:>12}\n", "", "forward", "backward");
  fmt::print(out, "{:<34} {:>12.4f} {:>12.4f}\n", "total send (GiB)", gib(static_cast<double>(m.fwd.total_send)),
             gib(static_cast<double>(m.bwd.total_send)));
  fmt::print(out, "{:<34} {:>12.4f} {:>12.4f}\n", "bottleneck max(send, recv) (GiB)",
             gib(static_cast<double>(m.fwd.bottleneck)), gib(static_cast<double>(m.bwd.bottleneck)));
  fmt::print(out, "{:<34} {:>12.4f}\n", fmt::format("USP closed form, u = {} (GiB)", u), gib(usp_fwd));
  fmt::print(out, "{:<34} {:>11.1f}%\n", "forward reduction against USP", reduction(static_cast<double>(m.fwd.total_send)));
  fmt::print(out, "{:<34} {:>12.4f}\n", "imbalance (max load / mean)", m.imbalance);
  fmt::print(out, "{:<34} {:>11.1f}%\n", "stage-0 (local) share of load", 100.0 * m.stage0_share);
}

}  // namespace cpsched::cli
