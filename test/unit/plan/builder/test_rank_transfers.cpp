// A rank's one-stage plan without relays keeps only the transfers of the
// blocks that rank sends and its own (the other receivers of a block it
// receives by one stand-in that cuts its rows where theirs begin or end), and
// counts every rank's tokens for the metrics: its plan and the builder's
// metrics must be those of every rank's transfers, and a builder that
// started so must still build any other plan as before.
#include <doctest/doctest.h>

#include <random>
#include <tuple>

#include "brute_force.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/timing/model.hpp"
#include "plan_fixtures.hpp"
#include "random_index_masks.hpp"
#include "random_specs.hpp"

using namespace cpsched;

namespace {

void check_same(const PassMetrics& x, const PassMetrics& y) {
  CHECK(x.send == y.send);
  CHECK(x.recv == y.recv);
  CHECK(x.total_send == y.total_send);
  CHECK(x.bottleneck == y.bottleneck);
}

void check_same(const Metrics& x, const Metrics& y) {
  check_same(x.fwd, y.fwd);
  check_same(x.bwd, y.bwd);
  CHECK(x.load == y.load);
  CHECK(x.stage0_load == y.stage0_load);
  CHECK(x.imbalance == y.imbalance);
  CHECK(x.stage0_share == y.stage0_share);
  CHECK(x.remote_qo_tokens == y.remote_qo_tokens);
  CHECK(x.remote_kv_tokens == y.remote_kv_tokens);
}

auto key(const std::vector<Transfer>& v) {
  std::vector<std::tuple<RowKind, std::int32_t, std::int32_t, Rank, Rank, Token>> out;
  for (const Transfer& t : v) out.emplace_back(t.kind, t.block, t.group, t.host, t.dst, t.tokens);
  return out;
}

// Every rank's own plan from a fresh builder (which then keeps only that
// rank's transfers), its metrics, then other plans from the same builder.
void check_rank_transfers(const Assignment& a, std::mt19937_64& rng) {
  const int P = a.grid->cp_size();
  const HardwareProfile hw = resolve_hardware_profile("cluster_8gpu_ib");
  const PlanOptions one{1, 0};
  const Plan full = build_plan(a, one);
  const Metrics want = compute_metrics(a);
  const std::vector<Transfer> all = PlanBuilder(a, 1).transfers();
  for (Rank r = 0; r < P; ++r) {
    CAPTURE(r);
    const int threads = 1 + static_cast<int>(rng() % static_cast<std::uint64_t>(2 * P));
    CAPTURE(threads);
    const PlanBuilder b(a, threads);
    PlanOptions o = one;
    o.rank = r;
    const Plan mine = b.build(o);
    CHECK(mine.ranks[static_cast<std::size_t>(r)] == full.ranks[static_cast<std::size_t>(r)]);
    check_same(b.metrics(), want);
    // Another rank from the same builder, then plans that need every rank's transfers.
    o.rank = (r + 1) % P;
    CHECK(b.build(o).ranks[static_cast<std::size_t>(o.rank)] == full.ranks[static_cast<std::size_t>(o.rank)]);
    PlanOptions staged{2 + static_cast<int>(rng() % 3), P >= 4 && rng() % 2 == 0 ? 2 : 0};
    if (rng() % 2 == 0) {  // the stage cut priced by ports too
      staged.hardware = &hw;
      staged.timer = &timing_model_timer();
    }
    CAPTURE(staged.stages);
    CAPTURE(staged.relay_node_size);
    CAPTURE(staged.hardware != nullptr);
    o = staged;
    o.rank = r;
    CHECK(b.build(o).ranks[static_cast<std::size_t>(r)] == build_plan(a, staged).ranks[static_cast<std::size_t>(r)]);
    CHECK(b.build(one).ranks == full.ranks);
    CHECK(key(b.transfers()) == key(all));
    check_same(b.metrics(), want);
  }
}

}  // namespace

TEST_CASE("a rank's own transfers give its plan and every rank's metrics, as all transfers do") {
  std::mt19937_64 rng(2024);
  int checked = 0;
  for (int it = 0; it < 24; ++it) {
    const int P = 2 + static_cast<int>(rng() % 9);
    const Token S = P * (4 + static_cast<Token>(rng() % 6)) + static_cast<Token>(rng() % 19);
    auto g = test::make_grid(test::random_document_mask(S, rng), P, {4, 2, 8, 2},
                             {rng() % 3 != 0, 1 + static_cast<int>(rng() % 2)});
    const Assignment a = it % 4 == 0 ? test::owner_assignment(g) : test::random_assignment(g, rng);
    CAPTURE(it);
    CAPTURE(P);
    CAPTURE(S);
    check_rank_transfers(a, rng);
    ++checked;
  }
  // Every mask kind, and token top-k masks (a cell per head group).
  for (MaskKind kind : {MaskKind::causal, MaskKind::sliding_window, MaskKind::share_question}) {
    auto g = test::random_grid(kind, 8, Heads{4, 2, 8, 2}, rng);
    CAPTURE(to_string(kind));
    check_rank_transfers(test::random_assignment(g, rng), rng);
    ++checked;
  }
  for (int P : {3, 8}) {
    auto g = std::make_shared<const TaskGrid>(
        test::planned(Problem::make(test::random_topk(97, 2, 5, rng), P, Heads{4, 2, 8, 2})));
    CAPTURE(P);
    check_rank_transfers(test::random_assignment(g, rng), rng);
    ++checked;
  }
  CHECK(checked == 29);
}

// The bytes of every rank, transfer by transfer: a transfer's out bytes go
// from its host to its receiver and its back bytes the other way.
TEST_CASE("the metrics' bytes from each rank's tokens are those summed transfer by transfer") {
  std::mt19937_64 rng(8);
  for (int it = 0; it < 10; ++it) {
    const int P = 2 + static_cast<int>(rng() % 7);
    auto g = test::make_grid(test::random_document_mask(P * 6 + static_cast<Token>(rng() % 11), rng), P);
    const Assignment a = test::random_assignment(g, rng);
    const std::vector<Transfer> ts = transfers(a);
    const Metrics m = PlanBuilder(a).metrics();
    CAPTURE(it);
    for (const bool fwd : {true, false}) {
      const TransferBytes b = fwd ? fwd_bytes_per_token(g->problem()) : bwd_bytes_per_token(g->problem());
      std::vector<Bytes> send(static_cast<std::size_t>(P), 0), recv = send;
      Token qo = 0;
      for (const Transfer& t : ts) {
        const bool q = t.kind == RowKind::qo;
        send[static_cast<std::size_t>(t.host)] += t.tokens * (q ? b.qo_out : b.kv_out);
        recv[static_cast<std::size_t>(t.dst)] += t.tokens * (q ? b.qo_out : b.kv_out);
        send[static_cast<std::size_t>(t.dst)] += t.tokens * (q ? b.qo_back : b.kv_back);
        recv[static_cast<std::size_t>(t.host)] += t.tokens * (q ? b.qo_back : b.kv_back);
        if (q) qo += t.tokens;
      }
      const PassMetrics& pm = fwd ? m.fwd : m.bwd;
      CHECK(pm.send == send);
      CHECK(pm.recv == recv);
      CHECK(m.remote_qo_tokens == qo);
    }
    check_same(compute_metrics(a, transfer_tokens(P, ts)), m);
  }
}
