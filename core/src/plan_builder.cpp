#include "cpsched/plan_builder.hpp"

#include <fmt/format.h>

#include "cpsched/error.hpp"
#include "cpsched/plan_validator.hpp"
#include "plan_builder_internal.hpp"

namespace cpsched {

namespace {

void build_pass(const Assignment& a, const plan_detail::Transfers& tr, const std::vector<int>& stage, int stages,
                const plan_detail::RelayOptions& relay, bool index_rows, std::vector<PassPlan*>& pass) {
  const plan_detail::XferLayout where = plan_detail::layout_comm(a, tr, stage, stages, relay, pass);
  plan_detail::build_calc(a, tr, stage, where, stages, pass, index_rows);
}

}  // namespace

Plan build_plan(const Assignment& a, const PlanOptions& options) {
  const int stages = options.stages;
  if (stages < 1) throw Error(fmt::format("plan: stages must be at least 1, got {}", stages));
  if (options.relay_node_size < 0)
    throw Error(fmt::format("plan: relay_node_size must be 0 (no relays) or the ranks per node, got {}",
                            options.relay_node_size));
  a.validate();
  const Problem& p = a.grid->problem();
  const auto P = static_cast<std::size_t>(a.grid->cp_size());

  Plan plan;
  plan.num_stages = stages;
  plan.sharding = a.grid->sharding();
  plan.ranks.resize(P);

  const plan_detail::Transfers tr = plan_detail::collect_transfers(a);
  const TransferBytes fb = fwd_bytes_per_token(p), bb = bwd_bytes_per_token(p);
  const std::vector<int> fwd_stage = plan_detail::assign_stages(a, tr, fb.qo_out, fb.kv_out, stages);
  // The stage cut depends on the bytes per token only through the QO : KV
  // ratio, and not at all when nothing but KV moves.
  bool has_qo = false;
  for (const plan_detail::Xfer& x : tr.xfers) has_qo |= x.kind == plan_detail::kQO;
  const bool same_cut = stages == 1 || !has_qo || fb.qo_out * bb.kv_out == bb.qo_out * fb.kv_out;
  const std::vector<int> bwd_stage =
      same_cut ? fwd_stage : plan_detail::assign_stages(a, tr, bb.qo_out, bb.kv_out, stages);

  std::vector<PassPlan*> pass(P);
  for (std::size_t r = 0; r < P; ++r) pass[r] = &plan.ranks[r].fwd;
  const int node = options.relay_node_size >= 2 ? options.relay_node_size : 0;
  build_pass(a, tr, fwd_stage, stages, {node, fb.qo_out, fb.kv_out}, options.index_rows, pass);
  if (bwd_stage == fwd_stage) {
    // Same stage cut: the backward description is the forward one.
    for (RankPlan& rp : plan.ranks) rp.bwd = rp.fwd;
  } else {
    for (std::size_t r = 0; r < P; ++r) pass[r] = &plan.ranks[r].bwd;
    build_pass(a, tr, bwd_stage, stages, {node, bb.qo_out, bb.kv_out}, options.index_rows, pass);
  }

#ifndef NDEBUG
  const std::vector<std::string> problems =
      options.index_rows || !a.grid->index_cells() ? validate_plan(a, plan) : std::vector<std::string>{};
  if (!problems.empty()) {
    std::string msg = fmt::format("plan builder produced an invalid plan ({} problems):", problems.size());
    for (std::size_t i = 0; i < problems.size() && i < 20; ++i) msg += "\n  " + problems[i];
    throw Error(msg);
  }
#endif
  return plan;
}

}  // namespace cpsched
