// Translation of CommMeta into per-peer NCCL message lists, and buffer sizing.
#include <doctest/doctest.h>

#include <random>

#include "brute_force.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/problem/metrics.hpp"
#include "host/plan/buffers.hpp"
#include "host/plan/transfers.hpp"
#include "plans.hpp"

using namespace cpsched;
namespace g = cpsched::gpu;

namespace {

// hq 4, hkv 2, D 8, 2 groups, bf16: a group's q row is 2 heads x 8 x 2 = 32 bytes.
const g::HeadLayout kHeads{4, 2, 8, 2, 2};

GroupCollectiveArg sample_arg() {
  GroupCollectiveArg a;
  a.input_split_sizes = {4, 3};
  a.input_ranges = {{10, 14}, {20, 23}};
  a.input_groups = {0, 1};
  a.dst_indices = {{1, 2}, {2}};
  a.output_split_sizes = {5, 2, 3};
  a.src_index = {1, 1, 2};
  a.output_groups = {0, 1, 0};
  return a;
}

}  // namespace

TEST_CASE("row bytes follow the heads of the split's group, the head dim and the dtype; lse is fp32") {
  CHECK(kHeads.row_bytes(g::Tensor::q, 1) == 32);
  CHECK(kHeads.row_bytes(g::Tensor::k, 1) == 16);
  CHECK(kHeads.row_bytes(g::Tensor::lse, 0) == 8);
  CHECK(kHeads.local_row_bytes(g::Tensor::q) == 64);
  CHECK(kHeads.local_row_bytes(g::Tensor::lse) == 16);
  CHECK(kHeads.head_offset(g::Tensor::q, 1) == 2);
  CHECK(kHeads.head_offset(g::Tensor::v, 1) == 1);
  CHECK_THROWS_AS(kHeads.heads(g::Tensor::q, 2), Error);
}

TEST_CASE("packed side: per peer, tensor by tensor, the splits naming it, with exact byte offsets") {
  const GroupCollectiveArg a = sample_arg();
  const g::Side fwd = g::packed_side(a, g::cast_tensors(g::Pass::fwd, RowKind::qo), kHeads, 0);
  REQUIRE(fwd.messages.size() == 2);
  CHECK(fwd.messages[0].peer == 1);
  CHECK(fwd.messages[0].offset == 0);
  CHECK(fwd.messages[0].bytes == 4 * 32);
  CHECK(fwd.messages[1].peer == 2);
  CHECK(fwd.messages[1].offset == 128);
  CHECK(fwd.messages[1].bytes == 7 * 32);
  CHECK(fwd.bytes == 352);
  REQUIRE(fwd.messages[1].segments.size() == 2);
  CHECK(fwd.messages[1].segments[1].row == 20);
  CHECK(fwd.messages[1].segments[1].offset == 128);
  CHECK(fwd.messages[1].segments[1].group == 1);

  // Backward QO: Q, O, dO (bf16) and lse (fp32), tensor-major.
  const g::Side bwd = g::packed_side(a, g::cast_tensors(g::Pass::bwd, RowKind::qo), kHeads, 0);
  const g::Message& m = bwd.messages[1];
  REQUIRE(m.chunks.size() == 4);
  CHECK(m.chunks[0].tensor == g::Tensor::q);
  CHECK(m.chunks[1].tensor == g::Tensor::o);
  CHECK(m.chunks[1].offset == 7 * 32);
  CHECK(m.chunks[3].tensor == g::Tensor::lse);
  CHECK(m.chunks[3].offset == 3 * 7 * 32);
  CHECK(m.chunks[3].bytes == 7 * 8);
  CHECK(m.bytes == 3 * 7 * 32 + 7 * 8);
}

TEST_CASE("buffer side: each source's rows are one block of the remote buffer, one NCCL call per tensor") {
  const GroupCollectiveArg a = sample_arg();
  const g::Side s = g::buffer_side(a, 7, g::reduce_tensors(g::Pass::fwd, RowKind::qo), kHeads, 3);
  REQUIRE(s.messages.size() == 2);
  CHECK(s.messages[0].peer == 1);
  REQUIRE(s.messages[0].chunks.size() == 2);
  CHECK(s.messages[0].chunks[0].row == 7);
  CHECK(s.messages[0].chunks[0].bytes == 7 * 32);
  CHECK(s.messages[0].chunks[1].tensor == g::Tensor::lse);
  CHECK(s.messages[0].chunks[1].bytes == 7 * 8);
  CHECK(s.messages[1].peer == 2);
  CHECK(s.messages[1].chunks[0].row == 14);
  CHECK(s.bytes == 10 * 40);
  CHECK(g::buffer_side(a, 0, g::reduce_tensors(g::Pass::fwd, RowKind::kv), kHeads, 3).messages.empty());
}

TEST_CASE("malformed collective args are rejected with the rank and split named") {
  GroupCollectiveArg a = sample_arg();
  a.src_index = {2, 1, 1};
  CHECK_THROWS_WITH_AS(g::buffer_side(a, 0, g::cast_tensors(g::Pass::fwd, RowKind::qo), kHeads, 3),
                       doctest::Contains("ordered by source"), Error);
  a = sample_arg();
  CHECK_THROWS_WITH_AS(g::packed_side(a, g::cast_tensors(g::Pass::fwd, RowKind::qo), kHeads, 2),
                       doctest::Contains("sent to the rank itself"), Error);
  a = sample_arg();
  a.input_ranges[1] = {20, 22};
  CHECK_THROWS_WITH_AS(g::packed_side(a, g::cast_tensors(g::Pass::fwd, RowKind::qo), kHeads, 0),
                       doctest::Contains("input split 1"), Error);
}

TEST_CASE("every rank's sends match its peers' receives, and the bytes equal the metrics, on random plans") {
  std::mt19937_64 rng(77);
  int checked = 0;
  for (int iter = 0; iter < 24; ++iter) {
    const Token S = 300 + static_cast<Token>(rng() % 400);
    const int P = 2 + static_cast<int>(rng() % 5);
    const bool flat = iter % 4 != 3;
    const int stages = 1 + iter % 3;
    auto c = test::make_plan_case(test::random_document_mask(S, rng), P, Heads{8, 4, 16, 2},
                                  GridOptions{flat, 1 + iter % 2}, stages, 1 + rng() % 1000);
    const g::HeadLayout h = g::HeadLayout::of(*c.problem);
    const Metrics met = compute_metrics(c.assignment);
    std::vector<std::vector<g::WireOp>> ops;
    for (Rank r = 0; r < P; ++r) {
      const auto& rp = c.plan.ranks[static_cast<std::size_t>(r)];
      const g::PassLists f = g::translate(rp.fwd, g::Pass::fwd, h, r);
      const g::PassLists b = g::translate(rp.bwd, g::Pass::bwd, h, r);
      ops.push_back(g::wire_ops(f, b, r));
      for (const auto& [lists, pm] : {std::pair{&f, &met.fwd}, std::pair{&b, &met.bwd}}) {
        Bytes send = 0, recv = 0;
        for (const g::StageLists& st : lists->stages)
          for (RowKind k : {RowKind::qo, RowKind::kv}) {
            send += st.of(k).cast_send.bytes + st.of(k).reduce_send.bytes;
            recv += st.of(k).cast_recv.bytes + st.of(k).reduce_recv.bytes;
          }
        CHECK(send == pm->send[static_cast<std::size_t>(r)]);
        CHECK(recv == pm->recv[static_cast<std::size_t>(r)]);
      }
    }
    const auto problems = g::cross_check(ops);
    INFO("iteration ", iter, ": ", problems.empty() ? std::string() : problems.front());
    CHECK(problems.empty());
    ++checked;
  }
  CHECK(checked == 24);
}

TEST_CASE("a receiver that expects one row less than its source sends is caught by the cross-check") {
  std::mt19937_64 rng(3);
  auto c = test::make_plan_case(test::random_document_mask(400, rng), 3, Heads{4, 2, 16, 2}, GridOptions{true, 1}, 1, 11);
  const g::HeadLayout h = g::HeadLayout::of(*c.problem);
  // Find a receiving rank and shrink its first QO output split (and its stage count) by one row.
  Rank victim = -1;
  for (Rank r = 0; r < 3 && victim < 0; ++r) {
    StageComm& sc = c.plan.ranks[static_cast<std::size_t>(r)].fwd.comm.stages[0];
    if (!sc.qo.output_split_sizes.empty()) {
      sc.qo.output_split_sizes[0] -= 1;
      sc.num_remote_qo_tokens -= 1;
      victim = r;
    }
  }
  REQUIRE(victim >= 0);
  std::vector<std::vector<g::WireOp>> ops;
  for (Rank r = 0; r < 3; ++r) {
    const auto& rp = c.plan.ranks[static_cast<std::size_t>(r)];
    ops.push_back(g::wire_ops(g::translate(rp.fwd, g::Pass::fwd, h, r), g::translate(rp.bwd, g::Pass::bwd, h, r), r));
  }
  const auto problems = g::cross_check(ops);
  REQUIRE_FALSE(problems.empty());
  CHECK(problems.front().find("fwd stage 1 QO") != std::string::npos);
}

TEST_CASE("buffer sizes: staging per stage is its packed messages, remote rows are the stages' receive rows") {
  std::mt19937_64 rng(8);
  auto c = test::make_plan_case(test::random_document_mask(512, rng), 4, Heads{8, 4, 16, 2}, GridOptions{true, 1}, 2, 5);
  const g::HeadLayout h = g::HeadLayout::of(*c.problem);
  for (Rank r = 0; r < 4; ++r) {
    const RankPlan& rp = c.plan.ranks[static_cast<std::size_t>(r)];
    const g::PassLists f = g::translate(rp.fwd, g::Pass::fwd, h, r);
    const g::PassLists b = g::translate(rp.bwd, g::Pass::bwd, h, r);
    const Token rows = c.plan.sharding.rank_tokens(r).size();
    const g::BufferSizes z = g::buffer_sizes(rp, f, b, h, rows);
    // Local: bf16 q, k, v, dO, o; fp32 o_acc, lse_acc, delta, dq, dk, dv.
    const Bytes q = rows * 8 * 16, kv = rows * 4 * 16;
    CHECK(z.local_bytes == 2 * (q + 2 * kv + q + q) + 4 * (q + rows * 8 + rows * 8 + q + 2 * kv));
    for (int p = 0; p < 2; ++p) {
      const g::PassLists& l = p == 0 ? f : b;
      REQUIRE(z.staging[p].size() == l.stages.size());
      Bytes at = 0;
      for (std::size_t s = 0; s < l.stages.size(); ++s) {
        const g::StageLists& st = l.stages[s];
        CHECK(z.staging[p][s].offset == at);
        CHECK(z.staging[p][s].bytes == st.qo.cast_send.bytes + st.kv.cast_send.bytes + st.qo.reduce_recv.bytes +
                                           st.kv.reduce_recv.bytes);
        at += z.staging[p][s].bytes;
      }
      const g::RemoteShape sh = g::remote_shape(p == 0 ? rp.fwd : rp.bwd, h);
      Token qo = 0;
      for (const StageComm& sc : (p == 0 ? rp.fwd : rp.bwd).comm.stages) qo += sc.num_remote_qo_tokens;
      CHECK(sh.qo_rows == qo);
      CHECK(sh.q_heads == 2);  // 8 q heads in 4 groups (one per kv head)
      Bytes sum = 0;
      for (const g::Region& reg : z.remote[p]) sum += reg.bytes;
      CHECK(sum == z.remote_bytes[p]);
      CHECK(z.remote[p].back().name == "staging");
      CHECK(z.remote[p].back().bytes == at);
    }
  }
}
