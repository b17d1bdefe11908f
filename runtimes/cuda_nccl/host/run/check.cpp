#include "check.hpp"

#include <cmath>
#include <fmt/format.h>
#include <limits>

#include "cpsched/base/error.hpp"
#include "inputs.hpp"
#include "virtual_ranks.hpp"

namespace cpsched::gpu {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace

double RankwiseCheck::Max::error() const {
  if (broken) return kInf;
  return diff == 0 ? 0 : diff / (ref > 0 ? ref : 1.0);
}

RankwiseCheck::RankwiseCheck(const Problem& p, const Plan& plan, std::uint64_t seed, int threads)
    : sharding_(plan.sharding), h_(HeadLayout::of(p)), seen_(static_cast<std::size_t>(plan.sharding.cp_size), false) {
  const sim::GlobalInputs in = global_inputs(p, seed);
  ref_ = sim::run_virtual_ranks(p, plan, in, threads).outputs;
}

void RankwiseCheck::add(Rank r, const RankOutputs& out) {
  if (r < 0 || r >= sharding_.cp_size) throw Error(fmt::format("cuda_nccl check: no rank {}", r));
  if (seen_[static_cast<std::size_t>(r)]) throw Error(fmt::format("cuda_nccl check: rank {} compared twice", r));
  const OutputWidths w = output_widths(h_);
  const std::size_t wo = w.o, wq = w.q, wk = w.k, wv = w.v, hq = w.lse;
  const RangeSet tokens = sharding_.rank_tokens(r);
  const auto rows = static_cast<std::size_t>(tokens.size());
  if (out.o.size() != rows * wo || out.lse.size() != rows * hq || out.dq.size() != rows * wq ||
      out.dk.size() != rows * wk || out.dv.size() != rows * wv)
    throw Error(fmt::format("cuda_nccl check: outputs of rank {} do not match its {} rows", r, rows));
  // Same terms as sim::compare_outputs, over this rank's tokens only.
  auto values = [](Max& m, const float* got, const float* ref, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const double d = std::abs(static_cast<double>(got[i]) - static_cast<double>(ref[i]));
      if (std::isnan(d)) m.broken = true;
      else m.diff = std::max(m.diff, d);
      m.ref = std::max(m.ref, std::abs(static_cast<double>(ref[i])));
    }
  };
  auto lses = [](Max& m, const float* got, const float* ref, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const float a = got[i], b = ref[i];
      if (std::isnan(a) || std::isnan(b)) {
        m.broken = true;
        continue;
      }
      if (std::isinf(a) || std::isinf(b)) {
        if (a != b) m.broken = true;  // a row empty in one and not in the other
        continue;
      }
      m.diff = std::max(m.diff, std::abs(static_cast<double>(a) - static_cast<double>(b)));
      m.ref = std::max(m.ref, std::abs(static_cast<double>(b)));
    }
  };
  std::size_t local = 0;
  for (const Range& x : tokens.ranges()) {
    const auto n = static_cast<std::size_t>(x.end - x.begin);
    const auto g = static_cast<std::size_t>(x.begin);
    values(o_, out.o.data() + local * wo, ref_.o.data() + g * wo, n * wo);
    values(dq_, out.dq.data() + local * wq, ref_.dq.data() + g * wq, n * wq);
    values(dk_, out.dk.data() + local * wk, ref_.dk.data() + g * wk, n * wk);
    if (wv > 0) values(dv_, out.dv.data() + local * wv, ref_.dv.data() + g * wv, n * wv);
    lses(lse_, out.lse.data() + local * hq, ref_.lse.data() + g * hq, n * hq);
    local += n;
  }
  seen_[static_cast<std::size_t>(r)] = true;
}

CheckResult RankwiseCheck::finish(double tolerance) const {
  for (std::size_t r = 0; r < seen_.size(); ++r)
    if (!seen_[r]) throw Error(fmt::format("cuda_nccl check: the outputs of rank {} were never compared", r));
  CheckResult c;
  c.errors = {o_.error(), lse_.error(), dq_.error(), dk_.error(), dv_.error()};
  c.tolerance = tolerance;
  c.passed = c.errors.max() <= tolerance;
  c.text = fmt::format(
      "self-check against the sim runtime (max |diff| / max |ref|, tolerance {:.1e}): "
      "O {:.2e}, lse {:.2e}, dQ {:.2e}, {}: {}",
      tolerance, c.errors.o, c.errors.lse, c.errors.dq,
      h_.shared ? fmt::format("dLatent (dK + dV) {:.2e}", c.errors.dk)
                : fmt::format("dK {:.2e}, dV {:.2e}", c.errors.dk, c.errors.dv),
      c.passed ? "passed" : "FAILED");
  return c;
}

CheckResult check_against_sim(const Problem& p, const Plan& plan, const std::vector<RankOutputs>& outputs,
                              std::uint64_t seed, double tolerance, int threads) {
  if (static_cast<int>(outputs.size()) != plan.sharding.cp_size)
    throw Error(fmt::format("cuda_nccl check: {} ranks' outputs for {} ranks", outputs.size(), plan.sharding.cp_size));
  RankwiseCheck check(p, plan, seed, threads);
  for (Rank r = 0; r < plan.sharding.cp_size; ++r) check.add(r, outputs[static_cast<std::size_t>(r)]);
  return check.finish(tolerance);
}

}  // namespace cpsched::gpu
