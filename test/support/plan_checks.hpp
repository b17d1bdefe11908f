#pragma once
// The plan tests' validity check: the validator's problems and, on problems
// small enough, the brute-force coverage count, each listed in the failure.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cpsched/problem/assignment.hpp"
#include "cpsched/plan/plan.hpp"
#include "cpsched/plan/validator.hpp"

namespace cpsched::test {

// One problem a line, for CHECK_MESSAGE.
inline std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

// validate_plan finds nothing; with `brute`, neither does the brute-force
// coverage (it is O(G x S^2): callers pass it for small problems only).
inline void check_valid_plan(const Assignment& a, const Plan& plan, bool brute) {
  const auto problems = validate_plan(a, plan);
  CHECK_MESSAGE(problems.empty(), joined(problems));
  if (brute) {
    const auto found = brute_force_plan_coverage(a, plan);
    CHECK_MESSAGE(found.empty(), joined(found));
  }
}

// Forward stage descriptions x and y receive the same rows per stage and
// reduce at the same points (relayed against plain).
inline void check_same_receives(const Plan& x, const Plan& y) {
  for (std::size_t r = 0; r < x.ranks.size() && r < y.ranks.size(); ++r)
    for (std::size_t s = 0; s < x.ranks[r].fwd.comm.stages.size(); ++s) {
      const StageComm& a = x.ranks[r].fwd.comm.stages[s];
      const StageComm& b = y.ranks[r].fwd.comm.stages.at(s);
      CHECK(a.num_remote_qo_tokens == b.num_remote_qo_tokens);
      CHECK(a.num_remote_kv_tokens == b.num_remote_kv_tokens);
      CHECK(a.qo_reduce_after == b.qo_reduce_after);
      CHECK(a.kv_reduce_after == b.kv_reduce_after);
    }
}

// Same args and comm on every rank and pass.
inline bool same_plan(const Plan& x, const Plan& y) {
  if (x.ranks.size() != y.ranks.size() || x.num_stages != y.num_stages) return false;
  for (std::size_t r = 0; r < x.ranks.size(); ++r)
    for (Pass p : {Pass::fwd, Pass::bwd}) {
      const PassPlan& a = pass_plan(x.ranks[r], p);
      const PassPlan& b = pass_plan(y.ranks[r], p);
      if (a.calc.local_attn_args != b.calc.local_attn_args || a.calc.remote_attn_args != b.calc.remote_attn_args ||
          a.comm.stages != b.comm.stages)
        return false;
    }
  return true;
}

}  // namespace cpsched::test
