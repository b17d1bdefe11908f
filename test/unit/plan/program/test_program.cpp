// The schedule as data (plan/program.hpp): the default program's order, the
// checks that reject what no executor could run, and the builder's programs
// (test_sim_program.cpp: one change followed by the timing model and the sim).
#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "cpsched/io/plan_json.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/plan/program.hpp"
#include "program_fixtures.hpp"

using namespace cpsched;
using test::early_reduce_plan;
using test::reduces_at_end;
using test::Fixture;

namespace {

std::vector<std::string> names(const Program& p) {
  std::vector<std::string> out;
  for (const Instr& i : p) out.push_back(to_string(i));
  return out;
}

}  // namespace

TEST_CASE("the default program: casts one stage ahead, reduces at their points, merge last") {
  const std::vector<int> qo{2, 2}, kv{1, 2};
  CHECK(names(pass_program(2, qo, kv, Pass::bwd)) ==
        std::vector<std::string>{"cast 1 first", "cast 1 forwarding", "compute 0", "wait_cast 1", "cast 2 first",
                                 "cast 2 forwarding", "compute 1", "reduce 1 kv forwarding", "reduce 1 kv first",
                                 "wait_cast 2", "compute 2", "reduce 1 qo forwarding", "reduce 1 qo first",
                                 "reduce 2 qo forwarding", "reduce 2 qo first", "reduce 2 kv forwarding",
                                 "reduce 2 kv first", "wait_reduces 2", "merge 2"});
  // The forward pass sends no KV back; 0 (nothing received) reduces after the last stage.
  CHECK(names(pass_program(1, std::vector<int>{0}, std::vector<int>{1}, Pass::fwd)) ==
        std::vector<std::string>{"cast 1 first", "cast 1 forwarding", "compute 0", "wait_cast 1", "compute 1",
                                 "reduce 1 qo forwarding", "reduce 1 qo first", "wait_reduces 1", "merge 1"});
  CHECK(names(pass_program(0, {}, {}, Pass::fwd)) ==
        std::vector<std::string>{"compute 0", "wait_reduces 0", "merge 0"});
  for (int n : {0, 1, 2, 5}) {
    const std::vector<int> after(static_cast<std::size_t>(n), n);
    for (Pass pass : {Pass::fwd, Pass::bwd})
      CHECK(program_error(pass_program(n, after, after, pass), n, after, after, pass).empty());
  }
}

TEST_CASE("program_error rejects what no executor could run") {
  const std::vector<int> qo{2, 2}, kv{1, 2};
  const Program good = pass_program(2, qo, kv, Pass::bwd);
  auto error_of = [&](Program p) { return program_error(p, 2, qo, kv, Pass::bwd); };
  auto without = [&](std::size_t k) {
    Program p = good;
    p.erase(p.begin() + static_cast<std::ptrdiff_t>(k));
    return p;
  };
  auto swapped = [&](std::size_t k) {
    Program p = good;
    std::swap(p[k], p[k + 1]);
    return p;
  };
  CHECK(error_of(good).empty());
  CHECK(error_of(without(0)).find("forwarding cast before its first phase") != std::string::npos);
  CHECK(error_of(without(3)).find("computed before its casts are waited for") != std::string::npos);
  CHECK(error_of(without(2)).find("compute 1 where stage 0 comes next") != std::string::npos);
  CHECK(error_of(swapped(6)).find("before stage 1 (its *_reduce_after) is computed") != std::string::npos);
  CHECK(error_of(swapped(7)).find("first-phase reduce before its forwarding phase") != std::string::npos);
  CHECK(error_of(without(good.size() - 1)).find("does not end with merge") != std::string::npos);
  CHECK(error_of(without(good.size() - 3)).find("reduced in both phases") != std::string::npos);
  // QO of stage 1 reduced right after stage 1: its rows are still read in stage 2.
  Program early = good;
  early.insert(early.begin() + 7, {Instr{Op::reduce, 1, RowKind::qo, Phase::forwarding},
                                   Instr{Op::reduce, 1, RowKind::qo, Phase::first}});
  early.erase(early.begin() + 13, early.begin() + 15);
  CHECK(error_of(early).find("before stage 2") != std::string::npos);
  Program kv_fwd = pass_program(2, qo, kv, Pass::fwd);
  kv_fwd.insert(kv_fwd.begin() + 7, Instr{Op::reduce, 1, RowKind::kv, Phase::forwarding});
  CHECK(program_error(kv_fwd, 2, qo, kv, Pass::fwd).find("KV reduce in the forward pass") != std::string::npos);
  CHECK(reduces_at_end(good) != good);
  CHECK(error_of(reduces_at_end(good)).empty());  // later is allowed
}

TEST_CASE("the builder writes each rank's default program, and the plan JSON carries it") {
  const Fixture f = early_reduce_plan();
  for (const RankPlan& r : f.plan.ranks) {
    CHECK(r.fwd.program == pass_program(r.fwd.comm.stages, Pass::fwd));
    CHECK(r.bwd.program == pass_program(r.bwd.comm.stages, Pass::bwd));
  }
  const Metrics m = compute_metrics(f.a);
  PlanExport e;
  e.assignment = &f.a;
  e.metrics = &m;
  e.plan = &f.plan;
  const std::string json = plan_json(e);
  CHECK(json.find("\"program\":[\"cast 1 first\",\"cast 1 forwarding\",\"compute 0\",\"wait_cast 1\"") !=
        std::string::npos);
}
