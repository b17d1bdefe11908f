#include "cpsched/timing/step_bound.hpp"

#include <algorithm>
#include <array>
#include <tuple>

#include "cpsched/problem/metrics.hpp"
#include "cpsched/hardware/task_kernel.hpp"

namespace cpsched {

namespace {

// Bytes on one rank's ports in one pass: [class][out, in].
using Ports = std::array<std::array<double, 2>, 2>;

}  // namespace

StepBound step_lower_bound(const TaskGrid& grid, const std::vector<Rank>& rank, const std::vector<Transfer>& xs,
                           const TimePrices& tp, int relay_node_size) {
  const Problem& p = grid.problem();
  const auto P = static_cast<std::size_t>(grid.cp_size());
  // Compute seconds per unit of load (area x q heads), as timing.cpp counts
  // an arg's FLOPs.
  const double fwd_flops = p.heads.fwd_flops_per_pair();
  const double per_load[2] = {fwd_flops * tp.flop_s[0], fwd_flops * p.heads.bwd_flops_ratio() * tp.flop_s[1]};
  std::vector<double> load(P, 0.0);
  for (TaskId t = 0; t < grid.num_tasks(); ++t)
    load[static_cast<std::size_t>(rank[static_cast<std::size_t>(t)])] += static_cast<double>(grid.load(t));
  // Under a kernel model each rank computes at least its tasks' args at the
  // kernels' rates (calls and a relay's cuts only add).
  std::vector<double> kernel[2];
  if (tp.kernel) {
    const std::shared_ptr<const TaskKernelSeconds> ks = task_kernel_seconds(grid, *tp.kernel);
    kernel[0].assign(P, 0.0);
    kernel[1].assign(P, 0.0);
    for (TaskId t = 0; t < grid.num_tasks(); ++t) {
      const auto r = static_cast<std::size_t>(rank[static_cast<std::size_t>(t)]);
      kernel[0][r] += ks->fwd[ks->unit_of(t)];
      kernel[1][r] += ks->bwd[ks->unit_of(t)];
    }
  }

  const TransferBytes per_token[2] = {fwd_bytes_per_token(p), bwd_bytes_per_token(p)};
  std::vector<Ports> ports[2] = {std::vector<Ports>(P, Ports{}), std::vector<Ports>(P, Ports{})};
  StepBound out;
  const NodeMap nodes{relay_node_size >= 2 ? relay_node_size : 1};
  const bool relays = relay_node_size >= 2;
  // (kind, block, group, node) of every transfer into another node than its
  // host's: a forwarding needs one of them twice.
  std::vector<std::tuple<int, std::int32_t, int, int>> into_nodes;
  for (const Transfer& x : xs) {
    const int c = tp.link_class(x.host, x.dst);
    const auto h = static_cast<std::size_t>(x.host), d = static_cast<std::size_t>(x.dst);
    const double tok = static_cast<double>(x.tokens);
    for (int pass = 0; pass < 2; ++pass) {
      const TransferBytes& b = per_token[pass];
      const bool qo = x.kind == RowKind::qo;
      const double cast = tok * static_cast<double>(qo ? b.qo_out : b.kv_out);
      const double back = tok * static_cast<double>(qo ? b.qo_back : b.kv_back);
      ports[pass][h][c][0] += cast;  // host sends the cast, receives the reduce
      ports[pass][d][c][1] += cast;
      ports[pass][d][c][0] += back;
      ports[pass][h][c][1] += back;
    }
    if (relays && !nodes.same_node(x.dst, x.host))
      into_nodes.emplace_back(static_cast<int>(x.kind), x.block, x.group, nodes.node_of(x.dst));
  }
  std::sort(into_nodes.begin(), into_nodes.end());
  out.may_forward = std::adjacent_find(into_nodes.begin(), into_nodes.end()) != into_nodes.end();
  for (int pass = 0; pass < 2; ++pass) {
    double plain = 0, compute = 0;
    for (std::size_t r = 0; r < P; ++r) {
      const double c = tp.kernel ? kernel[pass][r] : load[r] * per_load[pass];
      double port = 0;
      for (int cls = 0; cls < 2; ++cls)
        for (int dir = 0; dir < 2; ++dir) {
          const double bytes = ports[pass][r][cls][dir];
          if (bytes > 0) port = std::max(port, tp.latency_s[cls] + bytes * tp.byte_s[cls]);
        }
      compute = std::max(compute, c);
      plain = std::max(plain, std::max(c, port));
    }
    out.plain += plain;
    out.relayed += compute;
  }
  // Rounding: the timing model sums the same terms in another order.
  out.plain *= 1 - 1e-9;
  out.relayed *= 1 - 1e-9;
  return out;
}

}  // namespace cpsched
