// Index args (token top-k masks) in the GPU runtime, run by the CPU
// emulation: the work lists (q-major rows with their own keys, k-major cols
// over the host-built transpose), the plan codec, and whole plans of random
// and dsa top-k masks for P in {2, 3, 4}, stages 1 and 2, checked against the
// sim runtime on the same bf16 inputs (the check path of the range masks)
// and against the sim's dense reference (each KV head's boolean mask, key by
// key), which does not read the plan: a plan that loses a pair fails it.
#include <doctest/doctest.h>

#include <memory>
#include <random>

#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "host/backend/host_backend.hpp"
#include "host/plan/index_worklist.hpp"
#include "host/plan/plan_codec.hpp"
#include "host/run/check.hpp"
#include "host/run/emulate.hpp"
#include "host/run/inputs.hpp"
#include "host/run/rank_run.hpp"
#include "index_checks.hpp"
#include "plans.hpp"
#include "random_index_masks.hpp"

using namespace cpsched;
using cpsched::gpu::i64;
namespace g = cpsched::gpu;

using test::Checked;
using test::count_index_args;
using test::dsa_mask;
using test::run_and_check;

TEST_CASE("index args' launch lists: q rows with their key lists, 16-col tiles with their selecting rows and masks") {
  // q rows [0, 3) of the local buffer, keys in the hull [2, 6): row 0 -> {2, 5},
  // row 1 -> {3}, row 2 -> {5}; -1 skipped.
  const std::vector<std::int32_t> indices = {9, 9, 2, 5, -1, 3, 5, -1};
  AttnArg a;
  a.q = {0, 3};
  a.k = {2, 6};
  a.index_width = 2;
  a.index_offset = 2;
  // A second arg on rows [1, 3) of the same buffer, keys in [20, 40).
  const std::vector<std::int32_t> more = {21, 37, -1, -1};
  AttnArg b = a;
  b.q = {1, 3};
  b.k = {20, 40};
  b.index_offset = 8;
  std::vector<std::int32_t> pool = indices;
  pool.insert(pool.end(), more.begin(), more.end());
  const std::vector<AttnArg> args = {a, b};
  const g::IndexQList q = g::index_q_major(args, BufferId::local, pool);
  CHECK(q.area == 6);
  CHECK(q.rows == std::vector<i64>{0, 1, 2});    // row 2 of b has no valid key: only a's
  CHECK(q.begin == std::vector<std::int32_t>{0, 1, 3, 4});
  REQUIRE(q.items.size() == 4);
  CHECK((q.items[0].keys == 2 && q.items[0].width == 2 && q.items[0].other_buf == 0));
  CHECK(q.items[1].keys == 4);  // row 1 of a, then row 1 of b (arg order)
  CHECK(q.items[2].keys == 8);
  CHECK(q.items[3].keys == 6);
  CHECK(g::index_q_major(args, BufferId::remote, pool).empty());

  const g::IndexKList k = g::index_k_major(args, BufferId::local, pool);
  CHECK(k.area == 6);
  // Tiles of 16 cols: [0, 16) (a's keys 2, 3, 5), [16, 32) (b's 21), [32, 48) (b's 37).
  CHECK(k.tiles == std::vector<i64>{0, 16, 32});
  CHECK(k.begin == std::vector<std::int32_t>{0, 1, 2, 3});
  REQUIRE(k.items.size() == 3);
  // Tile 0: rows 0 (keys 2, 5), 1 (key 3), 2 (key 5), ascending, with their masks.
  CHECK((k.items[0].first == 0 && k.items[0].count == 3));
  CHECK(std::vector<std::int32_t>(k.rows.begin(), k.rows.begin() + 3) == std::vector<std::int32_t>{0, 1, 2});
  CHECK(k.masks[0] == ((1u << 2) | (1u << 5)));
  CHECK(k.masks[1] == (1u << 3));
  CHECK(k.masks[2] == (1u << 5));
  CHECK((k.items[1].count == 1 && k.rows[3] == 1 && k.masks[3] == (1u << 5)));   // key 21 = 16 + 5
  CHECK((k.items[2].count == 1 && k.rows[4] == 1 && k.masks[4] == (1u << 5)));   // key 37 = 32 + 5

  // A row with no valid key gets no item; a key twice in a row is refused.
  const std::vector<std::int32_t> none = {-1, -1, -1, -1, -1, -1};
  AttnArg c = a;
  c.index_offset = 0;
  CHECK(g::index_q_major(std::vector<AttnArg>{c}, BufferId::local, none).empty());
  CHECK(g::index_k_major(std::vector<AttnArg>{c}, BufferId::local, none).empty());
  const std::vector<std::int32_t> twice = {2, 2, 3, -1, 4, 5};
  CHECK_THROWS_WITH_AS(g::index_k_major(std::vector<AttnArg>{c}, BufferId::local, twice),
                       "cuda_nccl: index arg 0: row 0 selects key 2 twice", Error);
}

TEST_CASE("range args as index rows (MLA): each row's keys, cut at kIndexRowKeys, and the 16-col tiles' masks") {
  // A pool of 5 index keys, then the run 0 .. 2599 at rows_at = 5. Arg 0:
  // causal, rows wider than kIndexRowKeys (two items); arg 1: bi_causal on
  // the remote k buffer; arg 2: an index arg, left as before (row 2600 -> 7).
  constexpr i64 kN = 2600, kAt = 5;
  std::vector<std::int32_t> pool = {7, -1, 9, 9, 9};
  for (i64 j = 0; j < kN; ++j) pool.push_back(static_cast<std::int32_t>(j));
  std::vector<AttnArg> args(3);
  args[0].q = {0, 2600};
  args[0].k = {0, 2600};
  args[0].type = MaskType::causal;
  args[1].q = {100, 200};
  args[1].k = {40, 180};
  args[1].type = MaskType::bi_causal;
  args[1].k_buf = BufferId::remote;
  args[2].q = {2600, 2601};
  args[2].k = {7, 8};
  args[2].index_width = 2;
  args[2].index_offset = 0;
  args[2].index_area = 1;
  const std::span<const std::int32_t> indices(pool.data(), 5);
  // Without rows_at the range args stay out (GQA).
  CHECK(g::index_q_major(args, BufferId::local, indices).area == 1);
  CHECK(g::index_k_major(args, BufferId::local, indices).area == 1);

  const g::IndexQList q = g::index_q_major(args, BufferId::local, indices, kAt);
  i64 expect = 1;
  for (int a = 0; a < 2; ++a) expect += g::band_area(g::band_of(args[static_cast<std::size_t>(a)]));
  CHECK(q.area == expect);
  // Per row: the keys of its items (in order) are exactly its cols, arg by arg.
  std::vector<std::vector<std::pair<int, std::int32_t>>> got(static_cast<std::size_t>(kN) + 1);
  int wide = 0;
  for (std::size_t r = 0; r < q.rows.size(); ++r)
    for (std::int32_t i = q.begin[r]; i < q.begin[r + 1]; ++i) {
      const g::IndexQItem& it = q.items[static_cast<std::size_t>(i)];
      CHECK(it.width <= g::kIndexRowKeys);
      wide += it.width == g::kIndexRowKeys ? 1 : 0;
      for (std::int32_t j = 0; j < it.width; ++j)
        if (const std::int32_t key = pool[static_cast<std::size_t>(it.keys + j)]; key >= 0)
          got[static_cast<std::size_t>(q.rows[r])].push_back({it.other_buf, key});
    }
  CHECK(wide == kN - g::kIndexRowKeys + 1);  // rows 2047 .. 2599 of arg 0 (cols [0, row + 1)) hold one full item
  bool same = true;
  for (i64 row = 0; row <= kN; ++row) {
    std::vector<std::pair<int, std::int32_t>> want;
    for (int a = 0; a < 3; ++a) {
      const AttnArg& x = args[static_cast<std::size_t>(a)];
      if (row < x.q.begin || row >= x.q.end) continue;
      if (x.is_index()) {
        want.push_back({0, 7});
        continue;
      }
      const g::Iv c = g::row_cols(g::band_of(x), row);
      for (i64 k = c.b; k < c.e; ++k) want.push_back({x.k_buf == BufferId::local ? 0 : 1, static_cast<std::int32_t>(k)});
    }
    same = same && want == got[static_cast<std::size_t>(row)];
  }
  CHECK(same);

  // k-major over the remote k buffer (arg 1): every (row, col) bit is a mask entry, and no other.
  const g::IndexKList k = g::index_k_major(args, BufferId::remote, indices, true);
  const g::Band2 b = g::band_of(args[1]);
  CHECK(k.area == g::band_area(b));
  i64 bits = 0;
  bool inside = true;
  for (std::size_t t = 0; t < k.tiles.size(); ++t)
    for (std::int32_t i = k.begin[t]; i < k.begin[t + 1]; ++i) {
      const g::IndexKItem& it = k.items[static_cast<std::size_t>(i)];
      for (i64 u = it.first; u < it.first + it.count; ++u)
        for (int c = 0; c < g::kIndexColTile; ++c)
          if ((k.masks[static_cast<std::size_t>(u)] >> c) & 1u) {
            ++bits;
            inside = inside && g::band_contains(b, k.rows[static_cast<std::size_t>(u)], k.tiles[t] + c);
          }
    }
  CHECK(inside);
  CHECK(bits == k.area);
}

TEST_CASE("index args with keys outside their hull or past the pool are refused, naming the entry") {
  AttnArg a;
  a.q = {4, 6};
  a.k = {10, 12};
  a.index_width = 2;
  a.index_offset = 0;
  const std::vector<std::int32_t> bad = {10, 11, 12, -1};
  CHECK_THROWS_WITH_AS(g::index_q_major(std::vector<AttnArg>{a}, BufferId::local, bad),
                       "cuda_nccl: index arg 0: indices[2] (row 5, entry 0) = 12 is outside its k rows [10, 12)", Error);
  const std::vector<std::int32_t> shorter = {10, 11, 10};
  CHECK_THROWS_WITH_AS(g::index_k_major(std::vector<AttnArg>{a}, BufferId::local, shorter),
                       "cuda_nccl: index arg 0 reads indices [0, 4) of 3 (width 2)", Error);
  a.type = MaskType::causal;
  const std::vector<std::int32_t> good = {10, 11, 10, -1};
  CHECK_THROWS_WITH_AS(g::index_q_major(std::vector<AttnArg>{a}, BufferId::local, good),
                       "cuda_nccl: index arg 0 has mask type causal (index args are full)", Error);
}

TEST_CASE("a rank plan with index args survives encode/decode with its index pool") {
  std::mt19937_64 rng(5);
  auto c = test::make_index_plan_case(test::random_topk(150, 2, 7, rng), 3, Heads{4, 2, 16, 2}, GridOptions{true, 1}, 2, 9);
  REQUIRE(count_index_args(c.plan, true) > 0);
  for (const RankPlan& rp : c.plan.ranks) {
    int stages = 0;
    const RankPlan back = g::decode_rank_plan(g::encode_rank_plan(rp, c.plan.num_stages), &stages);
    CHECK(stages == 2);
    for (const auto& [x, y] : {std::pair{&rp.fwd, &back.fwd}, std::pair{&rp.bwd, &back.bwd}}) {
      CHECK(x->calc.local_attn_args == y->calc.local_attn_args);
      CHECK(x->calc.remote_attn_args == y->calc.remote_attn_args);
      CHECK(x->calc.indices == y->calc.indices);
      CHECK(x->comm.stages == y->comm.stages);
    }
  }
}

TEST_CASE("the emulated pipeline runs top-k plans (random and dsa) and matches the sim runtime") {
  std::mt19937_64 rng(31);
  struct Case {
    int P, stages, kv_heads, dim;
    bool dsa;
    std::uint64_t placement;
  };
  const Case cases[] = {{2, 1, 1, 16, false, 3}, {2, 2, 2, 16, true, 5},  {3, 1, 2, 32, false, 7},
                        {3, 2, 1, 16, true, 0},  {4, 1, 1, 16, true, 11}, {4, 2, 2, 16, false, 13},
                        {2, 2, 1, 16, false, 0}, {3, 1, 1, 16, true, 2},  {4, 2, 1, 32, true, 4}};
  for (const Case& k : cases) {
    const Token S = 80 * k.P + static_cast<Token>(rng() % 40);
    const auto mask = k.dsa ? dsa_mask(S, {S / 3, S / 4, S - S / 3 - S / 4}, rng()) : test::random_topk(S, k.kv_heads, 6, rng);
    // Per-head selections need flattened groups (one group per KV head); a
    // shared one runs with groups flattened or not.
    const bool flat = k.kv_heads == 2 || k.P % 2 == 0;
    auto c = test::make_index_plan_case(mask, k.P, Heads{4, 2, k.dim, 2}, GridOptions{flat, 1}, k.stages, k.placement);
    INFO("P=", k.P, " stages=", k.stages, " kv_heads=", k.kv_heads, " D=", k.dim, k.dsa ? " dsa" : " random",
         " placement=", k.placement);
    REQUIRE(count_index_args(c.plan, false) > 0);
    if (k.placement != 0) CHECK(count_index_args(c.plan, true) > 0);
    const Checked res = run_and_check(c);
    INFO(res.plan.text, "; dense reference: ", res.dense_error);
    CHECK(res.passed());
    CHECK(res.plan.errors.max() < 5e-3);
    CHECK(res.dense_error < 5e-3);
  }
}

TEST_CASE("index args: delaying either stream changes no bit, and the executor runs them with a broadcast plan") {
  std::mt19937_64 rng(37);
  auto c = test::make_index_plan_case(dsa_mask(300, {120, 180}, 3), 3, Heads{4, 2, 16, 2}, GridOptions{true, 1}, 2, 21);
  REQUIRE(count_index_args(c.plan, true) > 0);
  g::EmulatedRun eager, lazy_comm, lazy_compute;
  CHECK(run_and_check(c, g::Schedule::eager, &eager).passed());
  CHECK(run_and_check(c, g::Schedule::lazy_comm, &lazy_comm).passed());
  CHECK(run_and_check(c, g::Schedule::lazy_compute, &lazy_compute).passed());
  for (std::size_t r = 0; r < eager.outputs.size(); ++r) {
    CHECK(eager.outputs[r].o == lazy_comm.outputs[r].o);
    CHECK(eager.outputs[r].dk == lazy_comm.outputs[r].dk);
    CHECK(eager.outputs[r].dv == lazy_compute.outputs[r].dv);
    CHECK(eager.outputs[r].dq == lazy_compute.outputs[r].dq);
  }
  Params p;
  p.set("backend", std::string("emulate"));
  p.set("check", true);
  p.set("plan_source", std::string("broadcast"));
  const ExecutionReport rep = g::run_emulated(*c.problem, c.plan, g::parse_run_options(p), 11);
  INFO(rep.text);
  CHECK(rep.passed);
  CHECK(rep.text.find("plan from broadcast") != std::string::npos);
}

TEST_CASE("a top-k plan missing one remote index arg fails the dense comparison") {
  std::mt19937_64 rng(41);
  auto c = test::make_index_plan_case(test::random_topk(240, 1, 8, rng), 3, Heads{4, 2, 16, 2}, GridOptions{true, 1}, 1, 8);
  bool dropped = false;
  for (RankPlan& rp : c.plan.ranks) {
    auto& args = rp.fwd.calc.remote_attn_args[0];
    for (auto it = args.begin(); !dropped && it != args.end(); ++it)
      if (it->is_index()) {
        args.erase(it);
        dropped = true;
        break;
      }
  }
  REQUIRE(dropped);
  const Checked res = run_and_check(c);
  CHECK(res.plan.passed);  // the sim runs the same (broken) plan
  CHECK(res.dense_error > 0.05);
}

TEST_CASE("index args count their selected pairs in the FLOPs and their pools in the device bytes") {
  std::mt19937_64 rng(43);
  auto c = test::make_index_plan_case(test::random_topk(200, 1, 9, rng), 2, Heads{4, 2, 16, 2}, GridOptions{false, 1}, 1, 0);
  const g::HeadLayout h = g::HeadLayout::of(*c.problem);
  for (Rank r = 0; r < 2; ++r) {
    const RankPlan& rp = c.plan.ranks[static_cast<std::size_t>(r)];
    double pairs = 0;  // every arg's entries other than -1
    auto add = [&](const AttnArg& a) {
      REQUIRE(a.is_index());
      for (i64 e = 0; e < a.q.size() * a.index_width; ++e)
        pairs += rp.fwd.calc.indices[static_cast<std::size_t>(a.index_offset + e)] >= 0 ? 1 : 0;
    };
    for (const AttnArg& a : rp.fwd.calc.local_attn_args) add(a);
    for (const auto& s : rp.fwd.calc.remote_attn_args)
      for (const AttnArg& a : s) add(a);
    REQUIRE(pairs > 0);
    CHECK(g::pass_flops(rp.fwd.calc, *c.problem, g::Pass::fwd) == doctest::Approx(4.0 * pairs * 4 * 16));
    g::HostWorld world(2);
    g::HostBackend be(world, r);
    const g::RankPipeline pipe(be, rp, h, c.plan.sharding.rank_tokens(r).size());
    const auto pool_bytes = static_cast<Bytes>((rp.fwd.calc.indices.size() + rp.bwd.calc.indices.size()) * 4);
    CHECK(pool_bytes > 0);
    CHECK(pipe.metadata_bytes() > pool_bytes);  // the pools, the transposes and the work lists
  }
}

TEST_CASE("block selections (block top-k, per KV head or shared) run as range args and match the dense reference") {
  std::mt19937_64 rng(47);
  for (int P : {2, 3, 4})
    for (int heads : {1, 2}) {
      const Token S = 70 * P + static_cast<Token>(rng() % 30);
      auto c = test::make_index_plan_case(test::random_block_topk(S, heads, 4, 8, 3, rng), P, Heads{4, 2, 16, 2},
                                          GridOptions{true, 1}, 1 + P % 2, 5 + static_cast<std::uint64_t>(P));
      CHECK(count_index_args(c.plan, false) == 0);
      const Checked res = run_and_check(c);
      INFO("P=", P, " heads=", heads, ": ", res.plan.text, "; dense reference: ", res.dense_error);
      CHECK(res.passed());
      CHECK(res.dense_error < 5e-3);
    }
}

TEST_CASE("index args under relays (two-level collectives): the emulated pipeline matches both references") {
  std::mt19937_64 rng(53);
  int relayed = 0;
  for (std::uint64_t placement : {3u, 8u, 15u}) {
    auto c = test::make_index_plan_case(test::random_topk(400, 1, 10, rng), 4, Heads{4, 2, 16, 2}, GridOptions{true, 1},
                                        2, placement);
    PlanOptions o;
    o.stages = 2;
    o.relay_node_size = 2;
    c.plan = build_plan(c.assignment, o);
    relayed += c.plan.has_forwarding() ? 1 : 0;
    const Checked res = run_and_check(c);
    INFO("placement ", placement, ": ", res.plan.text, "; dense reference: ", res.dense_error);
    CHECK(res.passed());
  }
  CHECK(relayed >= 1);
}
