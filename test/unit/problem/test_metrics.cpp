#include <doctest/doctest.h>

#include "cpsched/plan/builder.hpp"
#include "cpsched/problem/metrics.hpp"

using namespace cpsched;

namespace {
std::shared_ptr<const TaskGrid> grid(Token S, int P, Heads h, bool flatten,
                                     std::vector<Slice> slices) {
  auto p = std::make_shared<Problem>(Problem::make(RangeMask(S, std::move(slices)), P, h, {flatten, 1}));
  return std::make_shared<TaskGrid>(p);
}
Assignment owner(std::shared_ptr<const TaskGrid> g) {
  Assignment a{g, {}};
  for (TaskId t = 0; t < g->num_tasks(); ++t) a.rank.push_back(g->q_host(t));
  return a;
}
const Heads kHeads{4, 2, 8, 2};  // hq 4, hkv 2, D 8, bf16: D*b = 16 bytes
}  // namespace

TEST_CASE("KV-only owner placement on a full mask, flattened: hand-computed bytes") {
  auto g = grid(4, 2, kHeads, true, {{{0, 4}, {0, 4}, MaskType::full}});
  REQUIRE(g->cells().size() == 4);
  Assignment a = owner(g);
  Metrics m = compute_metrics(a);
  // Rank 0 computes cell (0,1): needs k tokens [2,4) of rank 1, per group (1 kv head): 2 tokens x 2 x 16 B.
  CHECK(m.fwd.send == std::vector<Bytes>{128, 128});
  CHECK(m.fwd.recv == std::vector<Bytes>{128, 128});
  CHECK(m.fwd.total_send == 256);
  CHECK(m.fwd.bottleneck == 128);
  // Backward: K,V out and dK,dV back, 64 B per token per group each way.
  CHECK(m.bwd.send == std::vector<Bytes>{256, 256});
  CHECK(m.bwd.total_send == 512);
  CHECK(m.load == std::vector<std::int64_t>{2 * 4 * 4, 2 * 4 * 4});  // 2 cells x area 4 x 4 q heads
  CHECK(m.imbalance == doctest::Approx(1.0));
  CHECK(m.stage0_share == doctest::Approx(0.5));
}

TEST_CASE("QO transfer: Q out, O and lse back; flatten on and off give the same bytes") {
  for (bool flatten : {true, false}) {
    auto g = grid(4, 2, kHeads, flatten, {{{0, 4}, {0, 4}, MaskType::full}});
    Assignment a = owner(g);
    const int G = g->num_groups();
    // Cell (0,1) is cell index 1: move all its groups to rank 1 (the kv host).
    for (int grp = 0; grp < G; ++grp) a.rank[static_cast<std::size_t>(1 * G + grp)] = 1;
    Metrics m = compute_metrics(a);
    // Q: 2 tokens x 4 heads x 16 B = 128 to rank 1; O+lse back: 2 x 4 x (16+4) = 160.
    // Cell (1,0) stays on rank 1 and pulls K,V of rank 0: 2 tokens x 2 heads x 32 B = 128.
    CHECK(m.fwd.send == std::vector<Bytes>{128 + 128, 160});
    CHECK(m.fwd.recv == std::vector<Bytes>{160, 256});
    CHECK(m.fwd.bottleneck == 256);
    // Backward: Q,O,dO,lse out 2x4x(48+4)=416, dQ back 2x4x16=128; KV 128 out + 128 back.
    CHECK(m.bwd.send == std::vector<Bytes>{416 + 128, 128 + 128});
    CHECK(m.bwd.recv == std::vector<Bytes>{128 + 128, 416 + 128});
    CHECK(m.load == std::vector<std::int64_t>{16, 48});
    CHECK(m.imbalance == doctest::Approx(1.5));
  }
}

TEST_CASE("token granularity: only needed rows travel, once per destination and group") {
  // Causal over 6 tokens, P = 3: rank 2's block [4,6) needs k rows of blocks 0 and 1.
  auto g = grid(6, 3, Heads{2, 1, 8, 2}, true, {{{0, 6}, {0, 6}, MaskType::causal}});
  Assignment a = owner(g);
  auto ts = transfers(a);
  // KV of block 0 to ranks 1 and 2, of block 1 to rank 2; each 2 tokens.
  REQUIRE(ts.size() == 3);
  for (const Transfer& t : ts) {
    CHECK(t.kind == RowKind::kv);
    CHECK(t.tokens == 2);
  }
  // A document mask where block (2, 0) only needs its first key: [0, 1) seen by row 4 only.
  auto g2 = grid(6, 3, Heads{2, 1, 8, 2}, true,
                 {{{0, 4}, {0, 4}, MaskType::causal}, {{4, 6}, {0, 1}, MaskType::full}, {{4, 6}, {4, 6}, MaskType::causal}});
  Assignment a2 = owner(g2);
  Token kv_to_2_from_0 = 0;
  for (const Transfer& t : transfers(a2))
    if (t.dst == 2 && t.host == 0) kv_to_2_from_0 += t.tokens;
  CHECK(kv_to_2_from_0 == 1);
  // Two tasks on one rank that need the same q rows pull them once.
  auto g3 = grid(6, 3, Heads{2, 1, 8, 2}, false, {{{0, 6}, {0, 6}, MaskType::full}});
  Assignment a3 = owner(g3);
  // Cells (0,1) and (0,2): both to rank 1.
  a3.rank[1] = 1;
  a3.rank[2] = 1;
  Token q_to_1 = 0;
  for (const Transfer& t : transfers(a3))
    if (t.kind == RowKind::qo && t.dst == 1) q_to_1 += t.tokens;
  CHECK(q_to_1 == 2);
}

TEST_CASE("USP Ulysses degree and closed form") {
  CHECK(usp_ulysses_degree(8, 8) == 8);
  CHECK(usp_ulysses_degree(64, 8) == 8);
  CHECK(usp_ulysses_degree(12, 8) == 6);
  CHECK(usp_ulysses_degree(7, 8) == 7);
  CHECK(usp_ulysses_degree(8, 2) == 2);
  CHECK(usp_ulysses_degree(5, 4) == 1);
  auto g = grid(64, 8, Heads{64, 8, 128, 2}, true, {{{0, 64}, {0, 64}, MaskType::full}});
  // P = u = 8: (S/P)*D*b*(2*64*7/8 + 2*8*7/8) = 8*256*126.
  CHECK(usp_closed_form_fwd_bytes_per_rank(g->problem(), 8) == doctest::Approx(8.0 * 256 * 126));
}
