#include "cpsched/search/members.hpp"

#include <cpsched/base/error.hpp>

namespace cpsched::search {

Solver* MemberSolvers::get(const std::string& spec, const SolveInput& in, std::string& why) {
  if (auto it = solvers_.find(spec); it != solvers_.end()) return it->second.get();
  if (auto it = missing_.find(spec); it != missing_.end()) {
    why = it->second;
    return nullptr;
  }
  try {
    if (in.solvers() == nullptr) throw Error("the host offers no solver factory");
    // Members run single-threaded: the portfolio parallelises over its starts.
    solvers_[spec] = in.solvers()->make(spec, Params({{"threads", std::int64_t{1}}}));
    return solvers_[spec].get();
  } catch (const std::exception& e) {
    missing_[spec] = e.what();
    why = e.what();
    return nullptr;
  }
}

std::optional<Solution> MemberSolvers::solve(const std::string& spec, const SolveInput& in, std::string& why) {
  Solver* s = nullptr;
  std::mutex* busy = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s = get(spec, in, why);
    if (s == nullptr) return std::nullopt;
    busy = &busy_[spec];  // (map nodes stay put)
  }
  std::lock_guard<std::mutex> lock(*busy);
  try {
    // A member prices with the seed's area model, as it does on its own: its
    // placement is then the standalone solver's, and the host's timing model
    // judges it anyway (binary_greedy under time prices weighs every rank
    // pair apart, several times slower for the same kind of placement).
    static const AreaCostModel area;
    SolveInput member_in = in;
    member_in.with_cost(area);
    Solution sol = s->solve(member_in);
    sol.assignment.validate();
    return sol;
  } catch (const std::exception& e) {
    why = e.what();
    return std::nullopt;
  }
}

}  // namespace cpsched::search
