// The solver plugins binary_greedy, usp and static, loaded through the
// registry from the build's plugin folder: every task placed once, loads add
// up, binary_greedy's result does not depend on its thread count and meets mu
// where that is guaranteed, usp moves exactly its closed form on a full mask,
// static deals equal chunk counts and moves KV only.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "host_solve.hpp"
#include "plan_fixtures.hpp"
#include "brute_force.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/plugin/registry.hpp"
#include "test_helpers.hpp"

using namespace cpsched;

namespace {

Registry& registry() { return test::build_registry(); }

std::unique_ptr<Solver> make_solver(const std::string& name, Params given = {}) {
  Registry& reg = registry();
  return reg.make_solver(name, reg.resolve_params(reg.find(PluginKind::solver, name), given));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("no cpsched::Error thrown");
  return {};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Random document lengths adding up to S, several per shard.
std::vector<Token> random_lengths(Token S, std::mt19937_64& rng) {
  std::vector<Token> v;
  for (Token left = S; left > 0;) {
    const Token n = std::min<Token>(left, 1 + static_cast<Token>(rng() % static_cast<std::uint64_t>(S / 4 + 1)));
    v.push_back(n);
    left -= n;
  }
  return v;
}

// A random mask of each generator kind (slices: random documents with every slice type).
RangeMask random_mask(MaskKind kind, Token S, std::mt19937_64& rng) {
  if (kind == MaskKind::slices) return test::random_document_mask(S, rng);
  MaskSpec spec;
  spec.kind = kind;
  spec.seed = rng();
  if (kind != MaskKind::full && kind != MaskKind::causal) spec.lengths = random_lengths(S, rng);
  spec.window_left = 1 + static_cast<Token>(rng() % 40);
  spec.window_right = static_cast<Token>(rng() % 3);
  spec.block_size = 1 + static_cast<Token>(rng() % 30);
  spec.num_answers = 1 + static_cast<int>(rng() % 3);
  return make_mask(spec, S);
}

const MaskKind kAllKinds[] = {MaskKind::full,           MaskKind::causal,    MaskKind::full_document,
                              MaskKind::causal_document, MaskKind::sliding_window, MaskKind::prefix_lm,
                              MaskKind::share_question, MaskKind::block_causal_document, MaskKind::slices};

std::shared_ptr<const TaskGrid> make_grid(RangeMask mask, int P, Heads heads, GridOptions grid) {
  return std::make_shared<const TaskGrid>(
      test::planned(Problem::make(std::move(mask), P, heads, grid)));
}

Solution solve(Solver& s, const std::shared_ptr<const TaskGrid>& g) {
  static const AreaCostModel cost;
  return test::host_solve(s, g, cost);
}

// What every solver promises: a valid assignment whose loads add up to all
// the work of the problem (no task dropped, none counted twice).
void check_complete(const Assignment& a, const Problem& p) {
  REQUIRE(a.grid != nullptr);
  CHECK_NOTHROW(a.validate());
  const Metrics m = compute_metrics(a);
  const std::int64_t total = std::accumulate(m.load.begin(), m.load.end(), std::int64_t{0});
  CHECK(total == p.mask.area() * p.heads.q);
  CHECK(a.grid->total_area() == p.mask.area());
}

// Largest task load over the mean load: binary_greedy's iteration 0 takes
// every edge, and below (mu - 1) it then provably ends under mu x mean.
double largest_task_share(const TaskGrid& g) {
  std::int64_t biggest = 0, total = 0;
  for (TaskId t = 0; t < g.num_tasks(); ++t) {
    biggest = std::max(biggest, g.load(t));
    total += g.load(t);
  }
  return total > 0 ? static_cast<double>(biggest) * g.cp_size() / static_cast<double>(total) : 0.0;
}

}  // namespace

TEST_CASE("every solver places every task once, on random masks of every kind, uneven shards") {
  std::mt19937_64 rng(20240611);
  auto bg1 = make_solver("binary_greedy", Params({{"threads", std::int64_t{1}}}));
  auto bg4 = make_solver("binary_greedy", Params({{"threads", std::int64_t{4}}}));
  auto usp = make_solver("usp");
  auto stat = make_solver("static");
  int guaranteed = 0;
  for (MaskKind kind : kAllKinds) {
    for (int P : {2, 3, 5, 8}) {
      const Token S = Token{P} * 97 + 3;
      const RangeMask mask = random_mask(kind, S, rng);
      for (const GridOptions opt : {GridOptions{true, 1}, GridOptions{true, 2}, GridOptions{false, 1}}) {
        for (const Heads heads : {Heads{8, 2, 16, 2}, Heads{6, 6, 16, 2}}) {
          CAPTURE(to_string(kind));
          CAPTURE(P);
          CAPTURE(opt.flatten_head_groups);
          CAPTURE(opt.blocks_per_rank);
          CAPTURE(heads.kv);
          const auto grid = make_grid(mask, P, heads, opt);
          const Problem& p = grid->problem();

          const Solution a1_sol = solve(*bg1, grid);

          const Assignment& a1 = a1_sol.assignment;
          check_complete(a1, p);
          CHECK(a1.grid == grid);
          const Solution a4_sol = solve(*bg4, grid);
          const Assignment& a4 = a4_sol.assignment;
          CHECK(a4.rank == a1.rank);
          CHECK(a4_sol.feasible == a1_sol.feasible);
          const double imbalance = compute_metrics(a1).imbalance;
          if (largest_task_share(*grid) < 0.10) {
            ++guaranteed;
            CHECK(a1_sol.feasible);
            CHECK(imbalance <= 1.10 + 1e-12);
          }
          if (a1_sol.feasible) CHECK(imbalance <= 1.10 + 1e-12);

          if (opt.flatten_head_groups) {
            const Solution u_sol = solve(*usp, grid);
            const Assignment& u = u_sol.assignment;
            check_complete(u, p);
          } else {
            CHECK(contains(error_of([&] { solve(*usp, grid); }), "flattened head groups"));
          }

          const Solution s_sol = solve(*stat, grid);

          const Assignment& s = s_sol.assignment;
          check_complete(s, p);
          for (TaskId t = 0; t < s.grid->num_tasks(); ++t) CHECK(s.rank[static_cast<std::size_t>(t)] == s.grid->q_host(t));
        }
      }
    }
  }
  CHECK(guaranteed >= 20);  // the balance check above really ran
}

TEST_CASE("binary_greedy: the same assignment with 1, 2 and 4 threads on grids large enough to split") {
  // Tens of thousands of tasks and thousands of chunks, so that every
  // parallel stage really runs in several parts; G = 6 takes the generic task
  // order, G = 32 the shortcut.
  struct Case {
    MaskKind kind;
    int P;
    Heads heads;
    int blocks_per_rank;
  };
  const Case cases[] = {{MaskKind::causal, 8, Heads{32, 32, 16, 2}, 4},
                        {MaskKind::causal_document, 8, Heads{32, 32, 16, 2}, 4},
                        {MaskKind::causal, 8, Heads{24, 6, 16, 2}, 8},
                        {MaskKind::full, 70, Heads{8, 2, 16, 2}, 1}};
  std::mt19937_64 rng(7);
  TaskId largest = 0;
  for (const Case& c : cases) {
    CAPTURE(to_string(c.kind));
    CAPTURE(c.P);
    const Token S = Token{c.P} * 1499 + 5;
    const auto grid = make_grid(random_mask(c.kind, S, rng), c.P, c.heads, GridOptions{true, c.blocks_per_rank});
    REQUIRE(grid->num_tasks() > 3000);
    largest = std::max(largest, grid->num_tasks());
    std::vector<Rank> first;
    for (std::int64_t threads : {1, 2, 4}) {
      auto solver = make_solver("binary_greedy", Params({{"threads", threads}}));
      const Solution a_sol = solve(*solver, grid);
      const Assignment& a = a_sol.assignment;
      check_complete(a, grid->problem());
      if (first.empty()) first = a.rank;
      CHECK(a.rank == first);
    }
  }
  CHECK(largest > 2 * 8192);  // the per-task stages split too
}

TEST_CASE("binary_greedy: a single task above mu x mean is reported infeasible, with its real imbalance") {
  // One head group, one slice inside rank 0's shard: one task holds all the work.
  const auto grid = make_grid(RangeMask(400, {Slice{{0, 100}, {0, 100}, MaskType::full}}), 4, Heads{8, 2, 16, 2},
                              GridOptions{false, 1});
  auto solver = make_solver("binary_greedy");
  const Solution a_sol = solve(*solver, grid);
  const Assignment& a = a_sol.assignment;
  check_complete(a, grid->problem());
  CHECK_FALSE(a_sol.feasible);
  CHECK(contains(a_sol.note, "no assignment met mu"));
  CHECK(contains(a_sol.note, "imbalance 4.0000"));
  CHECK(contains(a_sol.note, "single task"));
  CHECK(compute_metrics(a).imbalance == doctest::Approx(4.0));
}

TEST_CASE("binary_greedy: parameters are checked when the solver is made") {
  CHECK(contains(error_of([] { make_solver("binary_greedy", Params({{"mu", 0.9}})); }), "mu = 0.9"));
  CHECK(contains(error_of([] { make_solver("binary_greedy", Params({{"max_iters", std::int64_t{0}}})); }),
                 "max_iters = 0"));
  CHECK(contains(error_of([] { make_solver("binary_greedy", Params({{"threads", std::int64_t{-1}}})); }),
                 "threads = -1"));
  CHECK(contains(error_of([] { make_solver("binary_greedy", Params({{"epsilon", 1.5}})); }), "epsilon = 1.5"));
}

TEST_CASE("usp: measured forward bytes equal the closed form (plus lse) on a full mask") {
  auto usp = make_solver("usp");
  for (const Heads heads : {Heads{64, 8, 128, 2}, Heads{64, 64, 128, 2}}) {
    for (int P : {8, 16, 32, 64}) {
      CAPTURE(heads.kv);
      CAPTURE(P);
      const Token per_rank = 64;
      const Token S = per_rank * P;
      MaskSpec spec;
      spec.kind = MaskKind::full;
      const auto grid = make_grid(make_mask(spec, S), P, heads, GridOptions{true, 1});
      const Problem& p = grid->problem();
      const Solution a_sol = solve(*usp, grid);
      const Assignment& a = a_sol.assignment;
      check_complete(a, p);
      const int u = usp_ulysses_degree(P, heads.kv);
      CHECK(u == 8);
      // Per rank: Q out and O back for (u - 1) / u of its query heads, and K, V
      // of every other block for hkv / u kv heads; lse (4 bytes per returned
      // O token and head) is what the closed form leaves out.
      const auto closed = static_cast<Bytes>(usp_closed_form_fwd_bytes_per_rank(p, u));
      CHECK(static_cast<double>(closed) == usp_closed_form_fwd_bytes_per_rank(p, u));
      const Bytes lse_per_rank = per_rank * heads.q * (u - 1) / u * 4;
      const Metrics m = compute_metrics(a);
      CHECK(m.fwd.total_send == (closed + lse_per_rank) * P);
      for (int r = 0; r < P; ++r) {
        CHECK(m.fwd.send[static_cast<std::size_t>(r)] == closed + lse_per_rank);
        CHECK(m.fwd.recv[static_cast<std::size_t>(r)] == closed + lse_per_rank);
      }
      // The lse share, counted from the transfers themselves.
      Bytes lse = 0;
      for (const Transfer& t : transfers(a))
        if (t.kind == RowKind::qo) lse += t.tokens * p.q_heads_per_task() * 4;
      CHECK(lse == lse_per_rank * P);
      CHECK(m.imbalance == doctest::Approx(1.0));
    }
  }
}

TEST_CASE("usp: needs flattened head groups, and places task (i, g) on (host(i) / u) * u + g * u / G") {
  auto usp = make_solver("usp");
  MaskSpec spec;
  spec.kind = MaskKind::causal;
  const auto flat = make_grid(make_mask(spec, 16 * 50 + 7), 16, Heads{32, 8, 16, 2}, GridOptions{true, 2});
  const Solution a_sol = solve(*usp, flat);
  const Assignment& a = a_sol.assignment;
  const int u = usp_ulysses_degree(16, 8);
  for (TaskId t = 0; t < flat->num_tasks(); ++t)
    CHECK(a.rank[static_cast<std::size_t>(t)] == (flat->q_host(t) / u) * u + flat->group_of(t) * u / 8);
  const auto not_flat = make_grid(make_mask(spec, 16 * 50 + 7), 16, Heads{32, 8, 16, 2}, GridOptions{false, 1});
  const std::string why = error_of([&] { solve(*usp, not_flat); });
  CHECK(contains(why, "usp"));
  CHECK(contains(why, "flatten_head_groups"));
}

TEST_CASE("static: equal chunk counts per rank, every task on its q host, only KV moves") {
  std::mt19937_64 rng(99);
  for (int P : {2, 3, 5, 8}) {
    for (MaskKind kind : {MaskKind::causal, MaskKind::causal_document, MaskKind::sliding_window}) {
      CAPTURE(P);
      CAPTURE(to_string(kind));
      const Token S = Token{P} * 97 + 3;
      const auto grid = make_grid(random_mask(kind, S, rng), P, Heads{8, 2, 16, 2}, GridOptions{true, 1});
      for (std::int64_t chunk : {0, 7}) {
        auto stat = make_solver("static", Params({{"chunk_tokens", chunk}}));
        const Solution a_sol = solve(*stat, grid);
        const Assignment& a = a_sol.assignment;
        check_complete(a, grid->problem());
        CHECK(a.grid != grid);
        const Token c = chunk > 0 ? chunk : std::max<Token>(1, S / (8 * P));
        const Token n = (S + c - 1) / c;
        // Chunks per rank: floor or ceil of n / P.
        std::vector<Token> count(static_cast<std::size_t>(P), 0);
        for (Token i = 0; i < n; ++i) {
          const Sharding& sh = a.grid->sharding();
          ++count[static_cast<std::size_t>(sh.host[static_cast<std::size_t>(sh.block_of(i * c))])];
        }
        for (const Token k : count) CHECK((k == n / P || k == (n + P - 1) / P));
        for (const Transfer& t : transfers(a)) CHECK(t.kind == RowKind::kv);
      }
    }
  }
  auto stat = make_solver("static", Params({{"chunk_tokens", std::int64_t{1000}}}));
  const auto small = make_grid(RangeMask(400, {Slice{{0, 400}, {0, 400}, MaskType::causal}}), 4, Heads{8, 2, 16, 2},
                               GridOptions{true, 1});
  CHECK(contains(error_of([&] { solve(*stat, small); }), "every rank needs at least one chunk"));
  CHECK(contains(error_of([] { make_solver("static", Params({{"chunk_tokens", std::int64_t{-3}}})); }),
                 "chunk_tokens = -3"));
}

TEST_CASE("static: chunks go largest area first to the least loaded rank with room") {
  // Causal over 8 chunks of 10 tokens on 2 ranks: chunk areas grow with the
  // position, so the deal alternates from the last chunk down and both ranks
  // end with 4 chunks and nearly equal area.
  auto stat = make_solver("static", Params({{"chunk_tokens", std::int64_t{10}}}));
  const auto grid = make_grid(RangeMask(80, {Slice{{0, 80}, {0, 80}, MaskType::causal}}), 2, Heads{2, 1, 16, 2},
                              GridOptions{true, 1});
  const Solution a_sol = solve(*stat, grid);
  const Assignment& a = a_sol.assignment;
  // Areas of chunks 7..0: 755, 655, 555, 455, 355, 255, 155, 55; the deal
  // is replayed below and its result checked against the hand computation
  // (ranks 0: chunks 7, 4, 3, 0; rank 1: chunks 6, 5, 2, 1).
  std::vector<Token> load(2, 0);
  std::vector<int> count(2, 0);
  std::vector<Rank> expect(8, -1);
  for (int c = 7; c >= 0; --c) {
    const Token area = 10 * 10 * c + 55;
    Rank best = -1;
    for (Rank r = 0; r < 2; ++r)
      if (count[static_cast<std::size_t>(r)] < 4 && (best < 0 || load[static_cast<std::size_t>(r)] < load[static_cast<std::size_t>(best)]))
        best = r;
    expect[static_cast<std::size_t>(c)] = best;
    load[static_cast<std::size_t>(best)] += area;
    ++count[static_cast<std::size_t>(best)];
  }
  for (int c = 0; c < 8; ++c) {
    CAPTURE(c);
    const int b = a.grid->sharding().block_of(10 * c);
    CHECK(a.grid->sharding().host[static_cast<std::size_t>(b)] == expect[static_cast<std::size_t>(c)]);
  }
  CHECK(load[0] == 755 + 455 + 355 + 55);
  CHECK(load[1] == 655 + 555 + 255 + 155);
}
