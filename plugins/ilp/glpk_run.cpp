#include "glpk_run.hpp"

#include <glpk.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csetjmp>

namespace cpsched::ilp {

namespace {

using Clock = std::chrono::steady_clock;

struct Callback {
  const std::vector<double>* warm = nullptr;
  bool offered = false;
  bool accepted = false;
  bool stopped = false;  // we ended the search at the run's end
  Clock::time_point end;
  double bound = -std::numeric_limits<double>::infinity();
};

// Called by glp_intopt; trivially destructible data only, so that an error
// hook's longjmp through it skips no destructor.
void on_tree(glp_tree* tree, void* info) {
  auto* cb = static_cast<Callback*>(info);
  if (!cb->stopped && Clock::now() >= cb->end) {
    cb->stopped = true;
    glp_ios_terminate(tree);
  }
  const int best = glp_ios_best_node(tree);
  if (best != 0) cb->bound = std::max(cb->bound, glp_ios_node_bound(tree, best));
  if (glp_ios_reason(tree) == GLP_IHEUR && cb->warm != nullptr && !cb->offered) {
    cb->offered = true;
    cb->accepted = glp_ios_heur_sol(tree, cb->warm->data()) == 0;
  }
}

struct Jump {
  std::jmp_buf buf;
};

void on_error(void* info) {
  glp_free_env();  // GLPK's objects are gone after a fatal error
  std::longjmp(static_cast<Jump*>(info)->buf, 1);
}

// Between setjmp and a possible longjmp only trivially destructible objects
// live in this frame.
// Milliseconds from now to `end`, at least 1 (GLPK reads 0 as "no time").
int ms_until(Clock::time_point end) {
  const double ms = std::chrono::duration<double, std::milli>(end - Clock::now()).count();
  return static_cast<int>(std::clamp(ms, 1.0, static_cast<double>(std::numeric_limits<int>::max() / 2)));
}

// Between setjmp and a possible longjmp only trivially destructible objects
// live in this frame.
bool guarded(glp_prob* lp, glp_smcp* smcp, glp_iocp* iocp, Clock::time_point end, int* lp_ret, int* ip_ret) {
  Jump jump;
  if (setjmp(jump.buf) != 0) {
    glp_error_hook(nullptr, nullptr);
    return false;
  }
  glp_error_hook(&on_error, &jump);
  smcp->tm_lim = ms_until(end);
  *lp_ret = glp_simplex(lp, smcp);
  *ip_ret = -1;
  if (*lp_ret == 0 && glp_get_status(lp) == GLP_OPT) {
    if (Clock::now() >= end) {
      *ip_ret = GLP_ETMLIM;  // the relaxation used the run's time: no search
    } else {
      iocp->tm_lim = ms_until(end);
      *ip_ret = glp_intopt(lp, iocp);
    }
  }
  glp_error_hook(nullptr, nullptr);
  return true;
}

}  // namespace

RunResult run_glpk(glp_prob* lp, const RunOptions& o) {
  RunResult res;
  const auto start = Clock::now();
  if (start >= o.deadline) {
    res.time_limit_hit = true;
    res.error = "not run: the time limit was spent";
    return res;
  }
  // This run's end: its share of what is left of the solve's time.
  const auto left = std::chrono::duration_cast<Clock::duration>((o.deadline - start) * std::clamp(o.share, 0.0, 1.0));
  const Clock::time_point end = start + left;

  glp_smcp smcp;
  glp_init_smcp(&smcp);
  smcp.msg_lev = GLP_MSG_OFF;
  smcp.presolve = GLP_OFF;  // keep the basis for glp_intopt

  Callback cb;
  cb.warm = o.warm;
  cb.end = end;
  glp_iocp iocp;
  glp_init_iocp(&iocp);
  iocp.msg_lev = GLP_MSG_OFF;
  iocp.mip_gap = o.mip_gap;
  iocp.cb_func = &on_tree;
  iocp.cb_info = &cb;
  iocp.bt_tech = GLP_BT_BLB;  // best bound first: the bound is what we report
  iocp.br_tech = GLP_BR_PCH;
  iocp.gmi_cuts = GLP_ON;
  iocp.mir_cuts = GLP_ON;
  iocp.cov_cuts = GLP_ON;
  iocp.clq_cuts = GLP_ON;
  iocp.fp_heur = GLP_ON;

  const int old_term = glp_term_out(GLP_OFF);
  int lp_ret = 0, ip_ret = -1;
  res.ok = guarded(lp, &smcp, &iocp, end, &lp_ret, &ip_ret);
  glp_term_out(old_term);
  res.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  res.warm_accepted = cb.accepted;
  if (!res.ok) {
    res.error = "GLPK stopped with a fatal error";
    return res;
  }
  res.lp_solved = lp_ret == 0 && glp_get_status(lp) == GLP_OPT;
  if (!res.lp_solved) {
    res.time_limit_hit = lp_ret == GLP_ETMLIM;
    res.infeasible = lp_ret == 0 && (glp_get_status(lp) == GLP_NOFEAS || glp_get_status(lp) == GLP_INFEAS);
    res.error = res.time_limit_hit ? "the LP relaxation did not finish in the time limit"
                : res.infeasible   ? "infeasible: even the LP relaxation cannot meet the balance cap"
                                   : "the LP relaxation failed (glp_simplex " + std::to_string(lp_ret) +
                                       ", status " + std::to_string(glp_get_status(lp)) + ")";
    return res;
  }
  res.root_bound = glp_get_obj_val(lp);
  res.bound = std::max(res.root_bound, cb.bound);
  // GLP_ESTOP: our callback ended the search at the run's end.
  res.time_limit_hit = ip_ret == GLP_ETMLIM || (ip_ret == GLP_ESTOP && cb.stopped);
  const int st = glp_mip_status(lp);
  if (st == GLP_OPT || st == GLP_FEAS) {
    res.has_incumbent = true;
    res.incumbent = glp_mip_obj_val(lp);
    const int n = glp_get_num_cols(lp);
    res.cols.assign(static_cast<std::size_t>(n) + 1, 0.0);
    for (int j = 1; j <= n; ++j) res.cols[static_cast<std::size_t>(j)] = glp_mip_col_val(lp, j);
  }
  // Finished without a limit: the incumbent is optimal (within mip_gap).
  res.optimal = ip_ret == 0 && st == GLP_OPT;
  if (res.optimal && o.mip_gap <= 0.0) res.bound = res.incumbent;
  if (res.has_incumbent) res.bound = std::min(res.bound, res.incumbent);
  if (ip_ret == 0 && st == GLP_NOFEAS) {
    res.infeasible = true;
    res.error = "infeasible: no integer placement meets the balance cap";
  } else if (ip_ret != 0 && !res.time_limit_hit && ip_ret != GLP_EMIPGAP) {
    res.error = "glp_intopt returned " + std::to_string(ip_ret);
  }
  return res;
}

}  // namespace cpsched::ilp
