// Numeric mode with index masks: plans of every solver for token top-k
// (index args), block top-k and BSR (range masks per KV head), the dsa and
// nsa generators, executed on virtual ranks, equal the reference computed
// key by key from the boolean mask (dense_mask), P in {2, 3, 4, 8}, stages
// 1, 2 and the solver's choice; GQA and MLA (shared latent) heads.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <random>

#include "cpsched/plugin/cost_model.hpp"
#include "plan_fixtures.hpp"
#include "host_solve.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/problem/problem.hpp"
#include "cpsched/problem/task_grid.hpp"
#include "random_index_masks.hpp"
#include "sim_outcome.hpp"
#include "test_helpers.hpp"

using namespace cpsched;

namespace {

// Every solver's plan at stages 1 and 2 passes the numeric check.
void check_numeric(const std::shared_ptr<const IndexMask>& mask, int P, Heads heads, const char* what) {
  auto grid = std::make_shared<const TaskGrid>(test::planned(Problem::make(mask, P, heads)));
  AreaCostModel cost;
  Registry& reg = test::build_registry();
  for (const std::string& name : test::solver_names()) {
    std::unique_ptr<Solver> solver =
        reg.make_solver(name, reg.resolve_params(reg.find(PluginKind::solver, name), test::quick_params(name)));
    const Solution a_sol = test::host_solve(*solver, grid, cost);
    const Assignment& a = a_sol.assignment;
    for (int stages : {1, 2}) {
      const test::Outcome out = test::run_numeric(a.grid->problem(), build_plan(a, stages));
      CHECK_MESSAGE(out.passed(), what, ": solver ", name, ", P ", P, ", stages ", stages, ": ", out.str());
    }
  }
}

// A BSR mask with partial blocks (causal inside) and full blocks, from a
// block top-k's choice: blocks on the diagonal are partial, the others full.
std::shared_ptr<const IndexMask> bsr_of(const IndexMask& b) {
  const Token nq = b.num_query_blocks();
  const std::int64_t n = b.indices.shape[2];
  auto indptr = std::make_shared<std::vector<std::int32_t>>(), indices = std::make_shared<std::vector<std::int32_t>>();
  auto full_indptr = std::make_shared<std::vector<std::int32_t>>(), full = std::make_shared<std::vector<std::int32_t>>();
  for (int h = 0; h < b.kv_heads; ++h) {
    indptr->push_back(0);
    full_indptr->push_back(0);
    std::int32_t np = 0, nf = 0;
    for (Token qb = 0; qb < nq; ++qb) {
      for (std::int64_t j = 0; j < n; ++j) {
        const std::int32_t kb = b.indices.data[(h * nq + qb) * n + j];
        if (kb < 0) continue;
        const bool straddles = (kb + 1) * b.block_k > qb * b.block_q;
        (straddles ? indices : full)->push_back(kb);
        ++(straddles ? np : nf);
      }
      indptr->push_back(np);
      full_indptr->push_back(nf);
    }
  }
  auto m = std::make_shared<IndexMask>();
  m->kind = IndexMaskKind::bsr;
  m->seqlen = b.seqlen;
  m->kv_heads = b.kv_heads;
  m->block_q = b.block_q;
  m->block_k = b.block_k;
  auto view = [](std::shared_ptr<std::vector<std::int32_t>> v, std::vector<std::int64_t> shape) {
    return IndexArray::own(std::move(v), std::move(shape), "<bsr>");
  };
  const auto H = static_cast<std::int64_t>(b.kv_heads);
  m->indptr = view(indptr, {H, nq + 1});
  m->full_indptr = view(full_indptr, {H, nq + 1});
  const auto ni = static_cast<std::int64_t>(indices->size()), nf = static_cast<std::int64_t>(full->size());
  m->indices = view(indices, {ni});
  m->full_indices = view(full, {nf});
  return m;
}

}  // namespace

TEST_CASE("numeric mode: token top-k index args, shared and per KV head") {
  std::mt19937_64 rng(21);
  for (int P : {2, 3, 4, 8}) {
    check_numeric(test::random_topk(83, 1, 7, rng), P, Heads{4, 2, 8, 2}, "top-k shared");
    check_numeric(test::random_topk(77, 2, 5, rng), P, Heads{4, 2, 8, 2}, "top-k per head");
  }
}

TEST_CASE("numeric mode: block top-k and BSR masks") {
  std::mt19937_64 rng(22);
  for (int P : {2, 3, 4, 8}) {
    const auto b = test::random_block_topk(96, 2, 4, 8, 3, rng);
    check_numeric(b, P, Heads{4, 2, 8, 2}, "block top-k per head");
    check_numeric(bsr_of(*b), P, Heads{4, 2, 8, 2}, "bsr per head");
    check_numeric(test::random_block_topk(90, 1, 1, 8, 3, rng), P, Heads{4, 2, 8, 2}, "block top-k shared, bq 1");
  }
}

TEST_CASE("numeric mode: the dsa and nsa generators, and MLA heads") {
  MaskSpec dsa;
  dsa.kind = MaskKind::dsa;
  dsa.lengths = {100, 60, 96};
  dsa.topk = 24;
  dsa.sink = 4;
  dsa.local = 8;
  MaskSpec nsa;
  nsa.kind = MaskKind::nsa;
  nsa.lengths = {128, 64, 64};
  nsa.nsa_block = 8;
  nsa.nsa_top = 5;
  for (int P : {2, 4}) {
    check_numeric(std::make_shared<const IndexMask>(make_index_mask(dsa, 256)), P, Heads{4, 2, 8, 2}, "dsa");
    check_numeric(std::make_shared<const IndexMask>(make_index_mask(nsa, 256)), P, Heads{4, 2, 8, 2}, "nsa");
    // DSA's MLA in MQA mode, small: 8 q heads share one latent of 24 dims, V its first 16.
    Heads mla{8, 1, 24, 2};
    mla.dim_v = 16;
    mla.kv_shared = true;
    check_numeric(std::make_shared<const IndexMask>(make_index_mask(dsa, 256)), P, mla, "dsa, MLA");
  }
}
