// Plan validator for a rank's plan (Plan::only_rank): the rank's entry among
// its peers' CommMeta, and a solve's plan of either kind (validate_result).
#include <fmt/format.h>

#include "cpsched/base/error.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/plan/validator.hpp"
#include "plan/validator/internal.hpp"

namespace cpsched {

std::vector<std::string> validate_rank_plan(const Assignment& a, const Plan& plan, Plan peers,
                                            const ValidateOptions& opt) {
  const Rank r = plan.only_rank;
  const auto P = static_cast<std::size_t>(a.grid ? a.grid->cp_size() : 0);
  if (r < 0 || static_cast<std::size_t>(r) >= P)
    return {fmt::format("plan: only_rank is {}: not one rank's plan of the {} ranks (validate_plan checks whole plans)",
                        r, P)};
  if (plan.ranks.size() != P || peers.ranks.size() != P)
    return {fmt::format("plan: {} rank entries, and {} in its peers' plan, for {} ranks", plan.ranks.size(),
                        peers.ranks.size(), P)};
  std::vector<std::string> out;
  // What must agree with the peers before the entry can be checked among them.
  if (plan.num_stages != peers.num_stages || plan.local_tail != peers.local_tail)
    out.push_back(fmt::format("plan: rank {}'s plan has {} stages{}, its peers' {}{}: they were built with other "
                              "options",
                              r, plan.num_stages, plan.local_tail ? " (a local tail)" : "", peers.num_stages,
                              peers.local_tail ? " (a local tail)" : ""));
  if (plan.sharding.blocks != peers.sharding.blocks || plan.sharding.host != peers.sharding.host)
    out.push_back(fmt::format("plan: rank {}'s plan indexes another sharding than its peers'", r));
  for (std::size_t s = 0; s < P; ++s)
    if (static_cast<Rank>(s) != r && !(plan.ranks[s] == RankPlan{}))
      out.push_back(fmt::format("plan: rank {}'s plan holds an entry for rank {} (a rank's plan holds its own only)",
                                r, s));
  if (!out.empty()) return out;
  peers.ranks[static_cast<std::size_t>(r)] = plan.ranks[static_cast<std::size_t>(r)];
  peers.only_rank = r;
  return validate_detail::validate_whole(a, peers, opt, r);
}

std::vector<std::string> validate_result(const SolveResult& r, const ValidateOptions& opt) {
  if (!r.assignment || !r.plan) throw Error("validate: the result holds no plan");
  if (r.plan->only_rank < 0) return validate_plan(*r.assignment, *r.plan, opt);
  // The peers: every rank's comm of the same assignment and shape, built as
  // the rank's own was (its stage cut and relays), without index pools (its
  // own entry replaces theirs).
  // (The shape names the cut the plan took, SolveResult::shape: no timer.)
  PlanOptions po{r.shape.stages, r.shape.relay_node_size()};
  po.hardware = r.hardware.get();
  if (po.hardware != nullptr) po.stage_cut = r.shape.cut;
  po.rank = r.plan->only_rank;
  po.peers_comm = true;
  po.index_rows = false;
  Plan peers;
  try {
    peers = build_plan(*r.assignment, po);
  } catch (const Error& e) {
    return {fmt::format("plan: the peers of rank {}'s plan could not be built from its assignment and shape: {}",
                        r.plan->only_rank, e.what())};
  }
  return validate_rank_plan(*r.assignment, *r.plan, std::move(peers), opt);
}

}  // namespace cpsched
