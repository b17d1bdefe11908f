// The search's time mode with relays (TimeObjective::relays) and the coupled
// step (TimeObjective::coupled): the incremental objective and per-rank
// seconds agree with a state built from scratch after random moves, each
// move's delta is the change the move makes, a block that several ranks of
// another node need crosses the NIC once, and the coupled step is made of the
// four maxima.
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <random>

#include "cpsched/search/byte_model.hpp"
#include "cpsched/search/state.hpp"
#include "random_specs.hpp"

using namespace cpsched;

namespace {

search::TimeObjective relay_objective(int gpus_per_node, bool coupled = false) {
  search::TimeObjective to;
  to.coupled = coupled;
  to.nodes.gpus_per_node = gpus_per_node;
  to.byte_s[0] = 1e-11;  // NVLink
  to.byte_s[1] = 8e-11;  // NIC
  to.load_s = 1e-9;
  to.relays = true;
  return to;
}

void check_same(const search::State& a, const search::State& b, int P) {
  CHECK(a.objective() == doctest::Approx(b.objective()).epsilon(1e-9));
  CHECK(a.max_rank_time() == doctest::Approx(b.max_rank_time()).epsilon(1e-9));
  for (Rank r = 0; r < P; ++r) {
    const search::PortSeconds x = a.port_seconds(r), y = b.port_seconds(r);
    REQUIRE(x.cast_in == doctest::Approx(y.cast_in).epsilon(1e-9));
    REQUIRE(x.cast_out == doctest::Approx(y.cast_out).epsilon(1e-9));
    REQUIRE(x.reduce_in == doctest::Approx(y.reduce_in).epsilon(1e-9));
    REQUIRE(x.reduce_out == doctest::Approx(y.reduce_out).epsilon(1e-9));
    REQUIRE(a.rank_time(r) == doctest::Approx(b.rank_time(r)).epsilon(1e-9));
  }
}

}  // namespace

TEST_CASE("relays, coupled step: incremental objective and deltas agree with a state built from scratch") {
  std::mt19937_64 rng(5);
  // 3 nodes of 8, and nodes of 4 with a partial last node (P = 22); with and
  // without relays, per-rank or coupled step.
  for (auto [P, node] : {std::pair{24, 8}, std::pair{22, 4}})
  for (const bool relays : {true, false})
  for (const bool coupled : {false, true}) {
    if (!relays && !coupled) continue;  // the plain time mode (test_search_state)
    for (MaskKind kind : {MaskKind::causal_document, MaskKind::full_document, MaskKind::causal}) {
      const auto grid = test::random_grid(kind, P, Heads{16, 4, 64, 2}, rng, Layout::fixed);
      const search::ByteModel model(*grid, 1.0, 1.0);
      search::TimeObjective to = relay_objective(node, coupled);
      to.relays = relays;
      const TaskId T = grid->num_tasks();
      // Start from the q hosts, then move tasks to random ranks, mostly of
      // one node, so that holder counts go through 0, 1, 2 and more.
      std::vector<Rank> start(static_cast<std::size_t>(T));
      for (TaskId t = 0; t < T; ++t) start[static_cast<std::size_t>(t)] = grid->q_host(t);
      const std::int64_t cap = std::numeric_limits<std::int64_t>::max() / 4;
      search::State st(model, start, cap, 0.0, &to);
      REQUIRE(st.relays() == relays);
      for (int i = 0; i < 600; ++i) {
        const auto t = static_cast<TaskId>(rng() % static_cast<std::uint64_t>(T));
        const Rank b = rng() % 4 != 0 ? static_cast<Rank>(node + rng() % static_cast<std::uint64_t>(node))
                                      : static_cast<Rank>(rng() % static_cast<std::uint64_t>(P));
        const double before = st.objective();
        const double d = st.delta(t, b);
        st.move(t, b);
        REQUIRE(st.objective() - before == doctest::Approx(d).epsilon(1e-9).scale(before));
        if (i % 3 == 0) st.checkpoint();
        if (i % 97 == 0) st.rollback();
      }
      const search::State fresh(model, st.placement(), cap, 0.0, &to);
      check_same(st, fresh, P);
    }
  }
}

TEST_CASE("coupled step: the busiest cast port, the most remote compute and the busiest reduce port") {
  std::mt19937_64 rng(9);
  const auto grid = test::random_grid(MaskKind::causal_document, 16, Heads{16, 4, 64, 2}, rng, Layout::fixed);
  const search::ByteModel model(*grid, 1.0, 1.0);
  const search::TimeObjective to = relay_objective(8, true);
  std::vector<Rank> start(static_cast<std::size_t>(grid->num_tasks()));
  for (auto& r : start) r = static_cast<Rank>(rng() % 16);
  const search::State st(model, start, std::numeric_limits<std::int64_t>::max() / 4, 0.0, &to);
  double compute = 0, remote = 0, cast = 0, reduce = 0, slowest = 0;
  for (Rank r = 0; r < 16; ++r) {
    const search::PortSeconds x = st.port_seconds(r);
    compute = std::max(compute, x.compute);
    remote = std::max(remote, x.compute - x.local);
    cast = std::max({cast, x.cast_in, x.cast_out});
    reduce = std::max({reduce, x.reduce_in, x.reduce_out});
    slowest = std::max(slowest, st.rank_time(r));
  }
  CHECK(st.max_rank_time() == doctest::Approx(std::max(compute, cast + remote) + reduce).epsilon(1e-12));
  CHECK(st.max_rank_time() >= slowest * (1 - 1e-12));  // never below the slowest rank's own time
}

TEST_CASE("relays: a q block that four ranks of another node need crosses the NIC once") {
  // P = 16 on two nodes of 8, ranks of 32 tokens: q block 15 (rank 15, node 1)
  // attends to kv blocks 0-3 (ranks 0-3, node 0), nothing else. The tasks of
  // head group 0 go to the kv hosts, so four ranks of node 0 need q block 15;
  // the other groups stay on rank 15.
  MaskSpec spec;
  spec.kind = MaskKind::slices;
  spec.slices = {{{480, 512}, {0, 128}, MaskType::full}};
  const Token S = 16 * 32;
  Problem p = Problem::make(make_mask(spec, S), 16, Heads{8, 4, 64, 2}, {true, 1});
  p.layout = Layout::fixed;
  const TaskGrid grid(std::make_shared<const Problem>(std::move(p)));
  const search::ByteModel model(grid, 1.0, 1.0);
  std::vector<Rank> home(static_cast<std::size_t>(grid.num_tasks()), 15);
  std::vector<Rank> spread = home;
  for (TaskId t = 0; t < grid.num_tasks(); ++t)
    if (grid.group_of(t) == 0) spread[static_cast<std::size_t>(t)] = grid.k_host(t);
  const std::int64_t cap = std::numeric_limits<std::int64_t>::max() / 4;
  search::TimeObjective relayed = relay_objective(8), direct = relayed;
  direct.relays = false;
  const double q_bytes = 32 * model.price(RowKind::qo).out;  // q block 15's cast bytes, one group
  const double nic = 8e-11, nvl = 1e-11;
  auto cast_out = [&](const search::TimeObjective& to, const std::vector<Rank>& placement) {
    return search::State(model, placement, cap, 0.0, &to).port_seconds(15).cast_out;
  };
  // Without relays the host sends q block 15 four times over the NIC, with
  // relays once.
  CHECK(cast_out(direct, spread) - cast_out(direct, home) == doctest::Approx(4 * q_bytes * nic).epsilon(1e-9));
  CHECK(cast_out(relayed, spread) - cast_out(relayed, home) == doctest::Approx(q_bytes * nic).epsilon(1e-9));
  // Node 0 receives it once over the NIC and forwards it three times over
  // NVLink: its ranks' cast-in seconds add up to that.
  const search::State with(model, spread, cap, 0.0, &relayed), without(model, home, cap, 0.0, &relayed);
  double node0 = 0;
  for (Rank r = 0; r < 8; ++r) node0 += with.port_seconds(r).cast_in - without.port_seconds(r).cast_in;
  CHECK(node0 == doctest::Approx(q_bytes * (nic + 3 * nvl)).epsilon(1e-9));
}
