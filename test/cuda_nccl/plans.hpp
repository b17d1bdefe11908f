#pragma once
// Plans for the CUDA runtime's tests: a problem, its grid, a seeded random
// placement of the tasks (so QO and KV both travel, splits go to several
// ranks, and every stage has work) and the plan the core builds from it.
#include <memory>
#include <random>

#include "cpsched/mask/generators.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/problem/task_grid.hpp"

namespace cpsched::test {

struct PlanCase {
  std::shared_ptr<const Problem> problem;
  std::shared_ptr<const TaskGrid> grid;
  Assignment assignment;
  Plan plan;
};

// A generated mask of `kind` over the given documents (or one of S tokens).
inline RangeMask generated_mask(MaskKind kind, Token seqlen, std::vector<Token> lengths = {}) {
  MaskSpec spec;
  spec.kind = kind;
  spec.lengths = std::move(lengths);
  return make_mask(spec, seqlen);
}

// placement_seed 0: every task on its q host (KV-only traffic).
inline PlanCase plan_case_of(std::shared_ptr<const Problem> problem, int ranks, int stages,
                             std::uint64_t placement_seed);

inline PlanCase make_plan_case(RangeMask mask, int ranks, Heads heads, GridOptions grid, int stages,
                               std::uint64_t placement_seed) {
  return plan_case_of(std::make_shared<const Problem>(Problem::make(std::move(mask), ranks, heads, grid)), ranks, stages,
                      placement_seed);
}

// The same for an index mask (token top-k: index args; block selections: range args per head).
inline PlanCase make_index_plan_case(std::shared_ptr<const IndexMask> mask, int ranks, Heads heads, GridOptions grid,
                                     int stages, std::uint64_t placement_seed) {
  return plan_case_of(std::make_shared<const Problem>(Problem::make(std::move(mask), ranks, heads, grid)), ranks, stages,
                      placement_seed);
}

inline PlanCase plan_case_of(std::shared_ptr<const Problem> problem, int ranks, int stages,
                             std::uint64_t placement_seed) {
  PlanCase c;
  c.problem = std::move(problem);
  c.grid = std::make_shared<const TaskGrid>(c.problem);
  c.assignment.grid = c.grid;
  std::mt19937_64 rng(placement_seed);
  for (TaskId t = 0; t < c.grid->num_tasks(); ++t)
    c.assignment.rank.push_back(placement_seed == 0 ? c.grid->q_host(t) : static_cast<Rank>(rng() % static_cast<std::uint64_t>(ranks)));
  c.plan = build_plan(c.assignment, stages);
  return c;
}

}  // namespace cpsched::test
