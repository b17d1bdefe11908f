// The bundled cost models (plugin/cost_model.hpp) and the unit prices of a
// hardware profile.
#include "cpsched/plugin/cost_model.hpp"

#include "cpsched/base/error.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/hardware/task_kernel.hpp"

namespace cpsched {

TimePrices time_prices(const HardwareProfile& hw) {
  TimePrices p;
  p.nodes = hw.nodes();
  p.byte_s[0] = 1.0 / (hw.intra_node.bandwidth_gb_s * 1e9);
  p.byte_s[1] = 1.0 / (hw.inter_node.bandwidth_gb_s * 1e9);
  p.latency_s[0] = hw.intra_node.latency_us * 1e-6;
  p.latency_s[1] = hw.inter_node.latency_us * 1e-6;
  p.flop_s[0] = 1.0 / (hw.fwd_tflops * 1e12);
  p.flop_s[1] = 1.0 / (hw.bwd_tflops * 1e12);
  if (hw.kernel) p.kernel = std::make_shared<const HardwareProfile>(hw);
  return p;
}

TimeCostModel::TimeCostModel(HardwareProfile hw) : hw_(std::move(hw)), prices_(time_prices(hw_)) {}

double TimeCostModel::compute(const TaskGrid& g, TaskId t) const {
  if (hw_.kernel) {
    thread_local std::vector<KernelArg> args;
    task_kernel_args(g, t, args);
    const Problem& p = g.problem();
    double s = 0;
    for (Pass pass : {Pass::fwd, Pass::bwd}) {
      const double fpp = task_flops_per_pair(p, g.flattened(), pass);
      for (const KernelArg& a : args)
        s += hw_.kernel->arg_seconds(pass, a, fpp, pass == Pass::fwd ? hw_.fwd_tflops : hw_.bwd_tflops);
    }
    return s;
  }
  // FLOPs = area x q heads x FLOPs per pair forward (4 D under GQA), and the
  // head geometry's backward ratio (2.5 under GQA) backward (timing/model.hpp).
  const Heads& h = g.problem().heads;
  const double fwd = static_cast<double>(g.load(t)) * h.fwd_flops_per_pair();
  return fwd * prices_.flop_s[0] + h.bwd_flops_ratio() * fwd * prices_.flop_s[1];
}

double TimeCostModel::transfer(const TaskGrid& g, RowKind kind, Token tokens, int heads, Rank src, Rank dst) const {
  if (src == dst) return 0.0;
  const Problem& p = g.problem();
  const TransferBytes f = fwd_bytes_per_token(p), b = bwd_bytes_per_token(p);
  // Bytes per token cover the heads of one task; scale to `heads`.
  const int all = kind == RowKind::qo ? p.q_heads_per_task() : p.kv_heads_per_task();
  const double per_token = kind == RowKind::qo ? static_cast<double>(f.qo_out + f.qo_back + b.qo_out + b.qo_back)
                                               : static_cast<double>(f.kv_out + f.kv_back + b.kv_out + b.kv_back);
  const double bytes = per_token * static_cast<double>(tokens) * heads / all;
  return bytes * prices_.byte_s[prices_.link_class(src, dst)];
}

}  // namespace cpsched
