// The sim runtime's timing model on hand-made plans whose times follow from
// the profile by hand: compute alone, one transfer, overlap, the reduce, and
// the figures derived from a timeline.
#include <doctest/doctest.h>

#include <limits>
#include <fmt/format.h>

#include <cmath>
#include <random>

#include "cpsched/base/error.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/plan/builder.hpp"
#include "plan_fixtures.hpp"
#include "random_specs.hpp"
#include "gantt_svg.hpp"
#include "report_text.hpp"
#include "cpsched/hardware/profile.hpp"
#include "cpsched/timing/model.hpp"
#include "cpsched/timing/stats.hpp"

using namespace cpsched;
using namespace cpsched::sim;

namespace {

// hbm_gb_s = 0: no pack / unpack / merge charges unless a test sets it.
HardwareProfile profile(bool overlap, int gpus_per_node = 8) {
  HardwareProfile hw;
  hw.name = "test";
  hw.fwd_tflops = 100;
  hw.bwd_tflops = 50;
  hw.gpus_per_node = gpus_per_node;
  hw.intra_node = {200, 5};  // 200 GB/s, 5 us
  hw.inter_node = {25, 20};
  hw.overlap = overlap;
  return hw;
}

// Full mask over S tokens on P ranks, heads 8:2, D 64, bf16, unflattened:
// every arg is group -1 (all 8 q heads).
Problem problem(Token S, int P) {
  return Problem::make(RangeMask(S, {{{0, S}, {0, S}, MaskType::full}}), P, Heads{8, 2, 64, 2}, {false, 1});
}

Plan empty_plan(const Problem& p, int stages = 1) {
  Plan plan;
  plan.num_stages = stages;
  plan.sharding = p.sharding;
  plan.ranks.resize(static_cast<std::size_t>(p.cp_size()));
  for (RankPlan& r : plan.ranks)
    for (PassPlan* pp : {&r.fwd, &r.bwd}) {
      pp->calc.remote_attn_args.resize(static_cast<std::size_t>(stages));
      pp->comm.stages.resize(static_cast<std::size_t>(stages));
    }
  return plan;
}

AttnArg local(Token n) { return {{0, n}, {0, n}, MaskType::full, BufferId::local, BufferId::local, -1}; }

// Rank `src` casts its first n KV rows to `dst` in stage 1 (both passes);
// `dst` reads them against its first n local rows in stage `stage`.
void add_kv_transfer(Plan& plan, int src, int dst, Token n, bool compute_on_it) {
  for (Pass pass : {Pass::fwd, Pass::bwd}) {
    PassPlan& s = pass == Pass::fwd ? plan.ranks[static_cast<std::size_t>(src)].fwd
                                    : plan.ranks[static_cast<std::size_t>(src)].bwd;
    PassPlan& d = pass == Pass::fwd ? plan.ranks[static_cast<std::size_t>(dst)].fwd
                                    : plan.ranks[static_cast<std::size_t>(dst)].bwd;
    GroupCollectiveArg& out = s.comm.stages[0].kv;
    out.input_split_sizes.push_back(n);
    out.input_ranges.push_back({0, n});
    out.input_groups.push_back(-1);
    out.dst_indices.push_back({dst});
    GroupCollectiveArg& in = d.comm.stages[0].kv;
    in.output_split_sizes.push_back(n);
    in.src_index.push_back(src);
    in.output_groups.push_back(-1);
    d.comm.stages[0].num_remote_kv_tokens += n;
    d.comm.stages[0].kv_reduce_after = s.comm.stages[0].kv_reduce_after = 1;
    if (compute_on_it)
      d.calc.remote_attn_args[0].push_back({{0, n}, {0, n}, MaskType::full, BufferId::local, BufferId::remote, -1});
  }
}

double flops_fwd(Token area, const Problem& p) { return 4.0 * static_cast<double>(area) * p.heads.q * p.heads.dim; }

// Rank `src` casts its first n Q rows to every rank of `dsts` (one input
// split) in stage 1 of `pass`; each dst computes on them in stage 1, and the
// outputs are reduced back after stage 1.
void add_qo_fanout(Plan& plan, Pass pass, int src, std::vector<Rank> dsts, Token n) {
  PassPlan& s = pass == Pass::fwd ? plan.ranks[static_cast<std::size_t>(src)].fwd
                                  : plan.ranks[static_cast<std::size_t>(src)].bwd;
  GroupCollectiveArg& out = s.comm.stages[0].qo;
  out.input_split_sizes.push_back(n);
  out.input_ranges.push_back({0, n});
  out.input_groups.push_back(-1);
  out.dst_indices.push_back(dsts);
  s.comm.stages[0].qo_reduce_after = 1;
  for (Rank dst : dsts) {
    PassPlan& d = pass == Pass::fwd ? plan.ranks[static_cast<std::size_t>(dst)].fwd
                                    : plan.ranks[static_cast<std::size_t>(dst)].bwd;
    GroupCollectiveArg& in = d.comm.stages[0].qo;
    in.output_split_sizes.push_back(n);
    in.src_index.push_back(src);
    in.output_groups.push_back(-1);
    d.comm.stages[0].num_remote_qo_tokens += n;
    d.comm.stages[0].qo_reduce_after = 1;
    d.calc.remote_attn_args[0].push_back({{0, n}, {0, 8}, MaskType::full, BufferId::remote, BufferId::local, -1});
  }
}

}  // namespace

TEST_CASE("compute alone takes FLOPs over throughput, backward 2.5x the FLOPs") {
  const Problem p = problem(64, 2);
  Plan plan = empty_plan(p);
  plan.ranks[0].fwd.calc.local_attn_args = {local(32)};
  plan.ranks[0].bwd.calc.local_attn_args = {local(32)};
  AttnArg causal = local(32);
  causal.type = MaskType::causal;
  plan.ranks[1].fwd.calc.local_attn_args = {causal};
  plan.ranks[1].bwd.calc.local_attn_args = {causal};
  const HardwareProfile hw = profile(true);
  const Timeline t = simulate_timeline(p, plan, hw);
  const double fwd0 = flops_fwd(32 * 32, p) / 100e12, fwd1 = flops_fwd(32 * 33 / 2, p) / 100e12;
  CHECK(t.fwd.ranks[0].end == doctest::Approx(fwd0).epsilon(1e-12));
  CHECK(t.fwd.ranks[1].end == doctest::Approx(fwd1).epsilon(1e-12));
  CHECK(t.bwd.ranks[0].end == doctest::Approx(2.5 * flops_fwd(32 * 32, p) / 50e12).epsilon(1e-12));
  CHECK(t.fwd.makespan() == doctest::Approx(fwd0));
  const PassStats s = pass_stats(t.fwd);
  CHECK(s.critical_rank == 0);
  CHECK(s.ranks[1].idle == doctest::Approx(fwd0 - fwd1));
  CHECK(s.overlap_ratio == 1.0);  // nothing moves
  CHECK(s.exposed_max == 0.0);
}

TEST_CASE("one transfer takes latency plus bytes over bandwidth, on the link of its class") {
  const Problem p = problem(64, 2);
  const Token n = 20;
  const double bytes_fwd = static_cast<double>(n * fwd_bytes_per_token(p).kv_out);
  CHECK(bytes_fwd == 20.0 * 2 * 2 * 64 * 2);  // K and V, 2 kv heads, D 64, bf16
  for (int gpn : {8, 1}) {
    CAPTURE(gpn);
    Plan plan = empty_plan(p);
    add_kv_transfer(plan, 1, 0, n, false);
    const HardwareProfile hw = profile(true, gpn);
    const Link& link = gpn == 8 ? hw.intra_node : hw.inter_node;
    const Timeline t = simulate_timeline(p, plan, hw);
    const double expect = link.latency_us * 1e-6 + bytes_fwd / (link.bandwidth_gb_s * 1e9);
    REQUIRE(t.fwd.ranks[0].comm.size() == 1);
    CHECK(t.fwd.ranks[0].comm[0].kind == OpKind::cast);
    CHECK(t.fwd.ranks[0].comm[0].end - t.fwd.ranks[0].comm[0].start == doctest::Approx(expect).epsilon(1e-12));
    CHECK(t.fwd.ranks[1].end == doctest::Approx(expect).epsilon(1e-12));
    CHECK(t.fwd.makespan() == doctest::Approx(expect).epsilon(1e-12));
    // Backward: K, V out, then dK, dV back (no compute here, so both at once after the cast).
    const double back = link.latency_us * 1e-6 + static_cast<double>(n * bwd_bytes_per_token(p).kv_back) /
                                                      (link.bandwidth_gb_s * 1e9);
    CHECK(t.bwd.makespan() == doctest::Approx(expect + back).epsilon(1e-12));
  }
}

TEST_CASE("splits to one peer pay one latency; latency is paid once per port, bytes add up") {
  const Problem p = problem(96, 3);
  Plan plan = empty_plan(p);
  add_kv_transfer(plan, 1, 0, 10, false);
  add_kv_transfer(plan, 1, 0, 10, false);  // second split, same peer: the same K and V messages
  const HardwareProfile hw = profile(true);
  const double per_tok = static_cast<double>(fwd_bytes_per_token(p).kv_out);  // 512
  // 5 us + 20 x 512 B / 200 GB/s = 5.0512 us
  const double one_peer = 5e-6 + 20 * per_tok / 200e9;
  PassTimeline t = simulate_pass(p, plan, hw, Pass::fwd);
  CHECK(t.makespan() == doctest::Approx(one_peer).epsilon(1e-12));
  REQUIRE(t.ranks[0].comm.size() == 1);
  CHECK(t.ranks[0].comm[0].messages == 2);  // K and V from rank 1
  // Rank 0 now also receives from rank 2: its incoming port carries 30 rows
  // and pays the latency once (grouped receives overlap their latencies):
  // 5 us + 30 x 512 / 200e9 = 5.0768 us, which both senders wait for.
  add_kv_transfer(plan, 2, 0, 10, false);
  const double two_peers = 5e-6 + 30 * per_tok / 200e9;
  t = simulate_pass(p, plan, hw, Pass::fwd);
  CHECK(t.makespan() == doctest::Approx(two_peers).epsilon(1e-12));
  CHECK(t.ranks[1].end == doctest::Approx(two_peers).epsilon(1e-12));
  CHECK(t.ranks[2].end == doctest::Approx(two_peers).epsilon(1e-12));
  CHECK(t.ranks[0].comm[0].messages == 4);  // (peer, tensor): 2 peers x K, V
  CHECK(t.ranks[1].comm[0].messages == 2);
}

TEST_CASE("with overlap, stage-0 compute and the stage-1 cast take the larger of the two") {
  const Problem p = problem(64, 2);
  const Token n = 32;
  for (Token local_rows : {Token{4}, Token{32}}) {  // cast longer, then compute longer
    CAPTURE(local_rows);
    Plan plan = empty_plan(p);
    plan.ranks[0].fwd.calc.local_attn_args = {local(local_rows)};
    add_kv_transfer(plan, 1, 0, n, false);
    const double c0 = flops_fwd(local_rows * local_rows, p) / 100e12;
    const double x = 5e-6 + static_cast<double>(n * fwd_bytes_per_token(p).kv_out) / 200e9;
    const Timeline on = simulate_timeline(p, plan, profile(true));
    const Timeline off = simulate_timeline(p, plan, profile(false));
    CHECK(on.fwd.ranks[0].end == doctest::Approx(std::max(c0, x)).epsilon(1e-12));
    CHECK(off.fwd.ranks[0].end == doctest::Approx(c0 + x).epsilon(1e-12));
    const PassStats s = pass_stats(on.fwd);
    CHECK(s.ranks[0].hidden == doctest::Approx(std::min(c0, x)).epsilon(1e-12));
    CHECK(s.ranks[0].exposed == doctest::Approx(std::max(0.0, x - c0)).epsilon(1e-9));
    CHECK(pass_stats(off.fwd).ranks[0].hidden == 0.0);

    // A remote stage on the received data starts once both are done.
    plan.ranks[0].fwd.calc.remote_attn_args[0] = {
        {{0, n}, {0, n}, MaskType::full, BufferId::local, BufferId::remote, -1}};
    const double c1 = flops_fwd(n * n, p) / 100e12;
    CHECK(simulate_timeline(p, plan, profile(true)).fwd.ranks[0].end ==
          doctest::Approx(std::max(c0, x) + c1).epsilon(1e-12));
  }
}

TEST_CASE("the group-reduce follows the last compute on both ends") {
  // Rank 0 casts Q rows to rank 1, which computes on them in stage 1 and
  // sends O and lse back: rank 0 ends after cast + compute + reduce.
  const Problem p = problem(64, 2);
  Plan plan = empty_plan(p);
  const Token n = 16;
  PassPlan& s = plan.ranks[0].fwd;
  PassPlan& d = plan.ranks[1].fwd;
  s.comm.stages[0].qo = {{n}, {{0, n}}, {-1}, {{1}}, {}, {}, {}};
  d.comm.stages[0].qo = {{}, {}, {}, {}, {n}, {0}, {-1}};
  d.comm.stages[0].num_remote_qo_tokens = n;
  s.comm.stages[0].qo_reduce_after = d.comm.stages[0].qo_reduce_after = 1;
  d.calc.remote_attn_args[0] = {{{0, n}, {0, 32}, MaskType::full, BufferId::remote, BufferId::local, -1}};
  const TransferBytes b = fwd_bytes_per_token(p);
  const double cast = 5e-6 + static_cast<double>(n * b.qo_out) / 200e9;
  const double c1 = flops_fwd(n * 32, p) / 100e12;
  const double back = 5e-6 + static_cast<double>(n * b.qo_back) / 200e9;
  const PassTimeline t = simulate_pass(p, plan, profile(true), Pass::fwd);
  CHECK(t.ranks[0].end == doctest::Approx(cast + c1 + back).epsilon(1e-12));
  REQUIRE(t.ranks[0].comm.size() == 2);
  CHECK(t.ranks[0].comm[1].kind == OpKind::reduce);
  CHECK(t.ranks[0].comm[1].start == doctest::Approx(cast + c1).epsilon(1e-12));  // waits for its peer
  const PassStats st = pass_stats(t);
  CHECK(st.ranks[0].idle == doctest::Approx(c1).epsilon(1e-9));  // nothing to do while rank 1 computes
  CHECK(st.overlap_ratio == 0.0);
}

TEST_CASE("a plan whose stage lists disagree with num_stages is an error naming the rank") {
  const Problem p = problem(64, 2);
  Plan plan = empty_plan(p);
  plan.ranks[1].bwd.comm.stages.clear();
  CHECK_THROWS_WITH_AS(simulate_timeline(p, plan, profile(true)), doctest::Contains("rank 1 bwd"), Error);
}

TEST_CASE("overlap_length of interval lists") {
  std::vector<TimedOp> a = {{OpKind::compute, 0, 0, 2, 0}, {OpKind::compute, 1, 3, 6, 0}};
  std::vector<TimedOp> b = {{OpKind::cast, 1, 1, 4, 0}, {OpKind::cast, 2, 5, 9, 0}};
  CHECK(overlap_length(a, b) == doctest::Approx(1 + 1 + 1));
  CHECK(overlap_length(a, {}) == 0);
}

TEST_CASE("the Gantt chart draws both passes, every shown rank and its ops") {
  const Problem p = problem(64, 2);
  Plan plan = empty_plan(p);
  plan.ranks[0].fwd.calc.local_attn_args = {local(8)};
  add_kv_transfer(plan, 1, 0, 8, true);
  const Timeline t = simulate_timeline(p, plan, profile(true));
  GanttOptions g;
  g.title = "T <&>";
  const std::string svg = gantt_svg(t, g);
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
  CHECK(svg.find("T &lt;&amp;&gt;") != std::string::npos);
  CHECK(svg.find("forward") != std::string::npos);
  CHECK(svg.find("backward") != std::string::npos);
  CHECK(svg.find("rank 0: group-cast stage 1") != std::string::npos);
  CHECK(svg.find("rank 1") != std::string::npos);
  g.max_ranks = 1;
  const std::string one = gantt_svg(t, g);
  CHECK(one.find("showing the 1 slowest of 2 ranks") != std::string::npos);
}

TEST_CASE("the Gantt time axis is bounded: a non-finite time is an error, any span at most a few dozen ticks") {
  // An infinite latency made the tick loop endless (and ate memory) before it was refused.
  Timeline t;
  t.fwd.ranks.resize(1);
  t.bwd.ranks.resize(1);
  t.fwd.ranks[0].compute.push_back(TimedOp{OpKind::compute, 0, 0, std::numeric_limits<double>::infinity(), 0});
  t.fwd.ranks[0].end = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH_AS(gantt_svg(t, GanttOptions{}), doctest::Contains("not a finite time"), Error);
  // Huge and tiny spans: a bounded number of tick lines.
  for (double end : {1e300, 1e-300, 3.7e9, 1.0}) {
    CAPTURE(end);
    t.fwd.ranks[0].compute[0].end = end;
    t.fwd.ranks[0].end = end;
    const std::string svg = gantt_svg(t, GanttOptions{});
    std::size_t lines = 0;
    for (std::size_t at = svg.find("<line"); at != std::string::npos; at = svg.find("<line", at + 1)) ++lines;
    CHECK(lines <= 2 * 52);
    CHECK(svg.size() < 20000);
  }
}

TEST_CASE("fan-out: one sender's outgoing port delays every receiver") {
  // Rank 0 casts one QO block of n rows to k = 4 peers. Forward Q is 8 heads
  // x 64 x 2 B = 1024 B per row. The sender's port carries k x n rows, each
  // receiver's n rows; processor sharing: every transfer ends when the
  // slower port, the sender's, has moved everything:
  //   5 us + 4 x 100 x 1024 B / 200 GB/s = 5 us + 2.048 us = 7.048 us.
  const Problem p = problem(80, 5);
  const Token n = 100;
  Plan plan = empty_plan(p);
  add_qo_fanout(plan, Pass::fwd, 0, {1, 2, 3, 4}, n);
  const double bytes = static_cast<double>(n * fwd_bytes_per_token(p).qo_out);
  CHECK(bytes == 102400.0);
  const PassTimeline t = simulate_pass(p, plan, profile(true), Pass::fwd);
  const double cast_end = 5e-6 + 4 * bytes / 200e9;
  CHECK(cast_end == doctest::Approx(7.048e-6).epsilon(1e-12));
  for (int r = 0; r < 5; ++r) {
    CAPTURE(r);
    REQUIRE(!t.ranks[static_cast<std::size_t>(r)].comm.empty());
    const TimedOp& c = t.ranks[static_cast<std::size_t>(r)].comm[0];
    CHECK(c.kind == OpKind::cast);
    CHECK(c.start == 0.0);
    CHECK(c.end == doctest::Approx(cast_end).epsilon(1e-12));
    CHECK(c.messages == (r == 0 ? 4 : 1));  // Q to / from each peer
  }
  // The reduce is the transpose, a fan-in of O and lse (1056 B per row):
  // rank 0's incoming port carries 4 x n rows; each receiver computed n x 8
  // cells first, so every reduce starts at cast_end + c1:
  //   end = cast_end + c1 + 5 us + 4 x 100 x 1056 / 200e9.
  const double c1 = flops_fwd(n * 8, p) / 100e12;
  const double back = 5e-6 + 4 * static_cast<double>(n * fwd_bytes_per_token(p).qo_back) / 200e9;
  for (int r = 0; r < 5; ++r) {
    CAPTURE(r);
    const TimedOp& red = t.ranks[static_cast<std::size_t>(r)].comm.back();
    CHECK(red.kind == OpKind::reduce);
    CHECK(red.start == doctest::Approx(cast_end + c1).epsilon(1e-12));
    CHECK(red.end == doctest::Approx(cast_end + c1 + back).epsilon(1e-12));
    CHECK(red.messages == (r == 0 ? 8 : 2));  // O and lse per peer
  }
}

TEST_CASE("fan-in: k senders into one receiver all end with the receiver's port") {
  // Ranks 1..3 each cast n = 50 KV rows (512 B per row) to rank 0:
  // rank 0's incoming port carries 3 x 25600 B: 5 us + 76800 / 200e9 = 5.384 us.
  const Problem p = problem(64, 4);
  Plan plan = empty_plan(p);
  for (int src = 1; src <= 3; ++src) add_kv_transfer(plan, src, 0, 50, false);
  const PassTimeline t = simulate_pass(p, plan, profile(true), Pass::fwd);
  const double expect = 5e-6 + 3 * 50 * 512.0 / 200e9;
  CHECK(expect == doctest::Approx(5.384e-6).epsilon(1e-12));
  for (int r = 0; r < 4; ++r) CHECK(t.ranks[static_cast<std::size_t>(r)].end == doctest::Approx(expect).epsilon(1e-12));
  CHECK(t.ranks[0].comm[0].messages == 6);  // 3 peers x K, V
}

TEST_CASE("mixed link classes: an NVLink and a NIC transfer from one rank run concurrently") {
  // Two GPUs per node: rank 0 -> rank 1 inside the node, rank 0 -> rank 2
  // between nodes, 100 KV rows each (51200 B). Separate ports, so rank 0
  // ends with the slower one, not the sum:
  //   inside:  5 us + 51200 / 200e9 = 5.256 us
  //   between: 20 us + 51200 / 25e9 = 22.048 us
  const Problem p = problem(96, 3);
  Plan plan = empty_plan(p);
  add_kv_transfer(plan, 0, 1, 100, false);
  add_kv_transfer(plan, 0, 2, 100, false);
  const PassTimeline t = simulate_pass(p, plan, profile(true, 2), Pass::fwd);
  CHECK(t.ranks[1].end == doctest::Approx(5.256e-6).epsilon(1e-12));
  CHECK(t.ranks[2].end == doctest::Approx(22.048e-6).epsilon(1e-12));
  CHECK(t.ranks[0].end == doctest::Approx(22.048e-6).epsilon(1e-12));
  CHECK(t.ranks[0].comm[0].messages == 4);
}

TEST_CASE("many small messages pay the latency once per port") {
  // Ranks 1..8 each send one KV row (512 B) to rank 0 (one node of 16
  // GPUs): 16 messages (K, V per peer) on one incoming port:
  // 5 us + 8 x 512 / 200e9 = 5.02048 us, not 16 or 8 latencies.
  const Problem p = problem(9 * 8, 9);
  Plan plan = empty_plan(p);
  for (int src = 1; src <= 8; ++src) add_kv_transfer(plan, src, 0, 1, false);
  const PassTimeline t = simulate_pass(p, plan, profile(true, 16), Pass::fwd);
  CHECK(t.makespan() == doctest::Approx(5.02048e-6).epsilon(1e-12));
  CHECK(t.ranks[0].comm[0].messages == 16);
  CHECK(t.ranks[0].comm[0].bytes == 8 * 512.0);
}

TEST_CASE("messages are counted per (peer, tensor) as cuda_nccl issues them") {
  const Problem p = problem(64, 2);
  Plan plan = empty_plan(p);
  add_qo_fanout(plan, Pass::fwd, 0, {1}, 4);
  add_qo_fanout(plan, Pass::bwd, 0, {1}, 4);
  add_kv_transfer(plan, 1, 0, 4, true);
  const Timeline t = simulate_timeline(p, plan, profile(true));
  auto msgs = [](const RankTimeline& r, OpKind k) {
    std::int64_t m = 0;
    for (const TimedOp& o : r.comm)
      if (o.kind == k) m += o.messages;
    return m;
  };
  // Forward: cast Q (QO) + K, V (KV) = 3 sent by... rank 0 sends Q, receives K, V.
  CHECK(msgs(t.fwd.ranks[0], OpKind::cast) == 1 + 2);
  CHECK(msgs(t.fwd.ranks[0], OpKind::reduce) == 2);  // O, lse back from rank 1
  // Backward: cast Q, O, dO, lse and K, V; reduce dQ and dK, dV.
  CHECK(msgs(t.bwd.ranks[0], OpKind::cast) == 4 + 2);
  CHECK(msgs(t.bwd.ranks[0], OpKind::reduce) == 1 + 2);
  CHECK(msgs(t.bwd.ranks[1], OpKind::reduce) == 1 + 2);
}

TEST_CASE("pack, unpack and merge are charged at the HBM bandwidth") {
  HardwareProfile hw = profile(true);
  hw.hbm_gb_s = 1000;  // 1e12 B/s
  SUBCASE("cast: pack on the sender's comm stream, unpack on the receiver's") {
    // Rank 1 casts 1000 KV rows (B = 512000 B) to rank 0.
    //   pack   2 B / 1e12          = 1.024 us on rank 1, [0, 1.024]
    //   wire   5 us + B / 200e9    = 7.56 us, [1.024, 8.584] (rank 0 waits for its peer)
    //   unpack 2 B / 1e12          = 1.024 us on rank 0: ends 9.608 us
    const Problem p = problem(64, 2);
    Plan plan = empty_plan(p);
    add_kv_transfer(plan, 1, 0, 1000, false);
    const PassTimeline t = simulate_pass(p, plan, hw, Pass::fwd);
    REQUIRE(t.ranks[1].comm.size() == 2);
    CHECK(t.ranks[1].comm[0].kind == OpKind::pack);
    CHECK(t.ranks[1].comm[0].start == 0.0);
    CHECK(t.ranks[1].comm[0].end == doctest::Approx(1.024e-6).epsilon(1e-12));
    CHECK(t.ranks[1].comm[1].start == doctest::Approx(1.024e-6).epsilon(1e-12));
    CHECK(t.ranks[1].end == doctest::Approx(8.584e-6).epsilon(1e-12));
    REQUIRE(t.ranks[0].comm.size() == 1);  // rank 0 sends nothing: no pack
    CHECK(t.ranks[0].comm[0].start == doctest::Approx(1.024e-6).epsilon(1e-12));
    CHECK(t.ranks[0].end == doctest::Approx(9.608e-6).epsilon(1e-12));
    // A stage computed on the data waits for the unpack.
    plan.ranks[0].fwd.calc.remote_attn_args[0] = {
        {{0, 32}, {0, 32}, MaskType::full, BufferId::local, BufferId::remote, -1}};
    const PassTimeline t2 = simulate_pass(p, plan, hw, Pass::fwd);
    REQUIRE(t2.ranks[0].compute.size() == 1);
    CHECK(t2.ranks[0].compute[0].start == doctest::Approx(9.608e-6).epsilon(1e-12));
  }
  SUBCASE("reduce: the merge runs on the receiver's compute stream after the collective") {
    // Rank 0 casts 16 Q rows (16384 B) to rank 1, which computes 16 x 8
    // cells and returns O and lse (16 x 1056 = 16896 B):
    //   cast:   pack 2 x 16384 / 1e12 = 32.768 ns; wire 5 us + 16384 / 200e9 = 5.08192 us;
    //           rank 1 unpacks 32.768 ns, then computes c1
    //   reduce: rank 1 packs 2 x 16896 / 1e12 = 33.792 ns, wire 5 us + 16896 / 200e9 = 5.08448 us
    //   merge:  3 x 16896 / 1e12 = 50.688 ns on rank 0's compute stream
    const Problem p = problem(64, 2);
    Plan plan = empty_plan(p);
    add_qo_fanout(plan, Pass::fwd, 0, {1}, 16);
    const PassTimeline t = simulate_pass(p, plan, hw, Pass::fwd);
    const double c1 = flops_fwd(16 * 8, p) / 100e12;
    const double cast_end1 = 32.768e-9 + 5.08192e-6 + 32.768e-9;
    const double reduce_start = cast_end1 + c1 + 33.792e-9;
    const double reduce_end = reduce_start + 5.08448e-6;
    REQUIRE(t.ranks[0].comm.size() == 3);  // pack, cast, reduce
    CHECK(t.ranks[0].comm[2].kind == OpKind::reduce);
    CHECK(t.ranks[0].comm[2].start == doctest::Approx(reduce_start).epsilon(1e-12));
    CHECK(t.ranks[0].comm[2].end == doctest::Approx(reduce_end).epsilon(1e-12));
    REQUIRE(t.ranks[0].compute.size() == 1);
    const TimedOp& m = t.ranks[0].compute[0];
    CHECK(m.kind == OpKind::merge);
    CHECK(m.start == doctest::Approx(reduce_end).epsilon(1e-12));
    CHECK(m.end == doctest::Approx(reduce_end + 50.688e-9).epsilon(1e-12));
    CHECK(t.ranks[0].end == doctest::Approx(reduce_end + 50.688e-9).epsilon(1e-12));
    CHECK(t.ranks[1].end == doctest::Approx(reduce_end).epsilon(1e-12));  // the sender merges nothing
    // The merge counts as compute time of rank 0 in the pass figures.
    CHECK(pass_stats(t).ranks[0].compute == doctest::Approx(50.688e-9).epsilon(1e-9));
  }
}

TEST_CASE("compute bound and step / bound") {
  // Rank 0: a full 32 x 32 arg; rank 1: a causal one (528 cells), both passes.
  const Problem p = problem(64, 2);
  Plan plan = empty_plan(p);
  AttnArg causal = local(32);
  causal.type = MaskType::causal;
  for (Pass pass : {Pass::fwd, Pass::bwd}) {
    (pass == Pass::fwd ? plan.ranks[0].fwd : plan.ranks[0].bwd).calc.local_attn_args = {local(32)};
    (pass == Pass::fwd ? plan.ranks[1].fwd : plan.ranks[1].bwd).calc.local_attn_args = {causal};
  }
  const HardwareProfile hw = profile(true);
  const double f0 = flops_fwd(1024, p), f1 = flops_fwd(528, p);
  // Per rank fwd F / 100e12 + bwd 2.5 F / 50e12; the bound is their mean.
  const double bound = (f0 / 100e12 + 2.5 * f0 / 50e12 + f1 / 100e12 + 2.5 * f1 / 50e12) / 2;
  CHECK(compute_bound(p, plan, hw) == doctest::Approx(bound).epsilon(1e-12));
  const StepEstimate e = estimate_step(p, plan, hw);
  CHECK(e.compute_bound == doctest::Approx(bound).epsilon(1e-12));
  // The step is the slower rank, rank 0, in both passes.
  CHECK(e.step() == doctest::Approx(f0 / 100e12 + 2.5 * f0 / 50e12).epsilon(1e-12));
  CHECK(e.ratio() == doctest::Approx(2 * 1024.0 / (1024 + 528)).epsilon(1e-12));
  CHECK(StepEstimate{}.ratio() == 1.0);  // nothing to compute
}

TEST_CASE("estimate_step equals the timeline's makespans exactly, and ops are well ordered") {
  std::mt19937_64 rng(7);
  TimingWorkspace ws;
  for (int rep = 0; rep < 12; ++rep) {
    const int P = 2 + rep % 7;
    const auto grid = test::random_grid(static_cast<MaskKind>(rep % 4), P, Heads{8, 4, 16, 2}, rng);
    const Plan plan = build_plan(test::random_assignment(grid, rng), 1 + rep % 4);
    const Problem& p = grid->problem();
    for (int gpn : {8, 2}) {
      HardwareProfile hw = profile(rep % 3 != 0, gpn);
      hw.hbm_gb_s = rep % 2 ? 2000 : 0;
      const Timeline t = simulate_timeline(p, plan, hw);
      const StepEstimate e = estimate_step(p, plan, hw, ws);
      CHECK(e.fwd == t.fwd.makespan());
      CHECK(e.bwd == t.bwd.makespan());
      CHECK(e.compute_bound == compute_bound(p, plan, hw));
      CHECK(estimate_step(p, plan, hw).step() == e.step());
      for (const PassTimeline* pt : {&t.fwd, &t.bwd})
        for (const RankTimeline& r : pt->ranks)
          for (const auto* ops : {&r.compute, &r.comm})
            for (std::size_t i = 0; i < ops->size(); ++i) {
              CHECK((*ops)[i].start <= (*ops)[i].end);
              if (i > 0) CHECK((*ops)[i - 1].end <= (*ops)[i].start);
            }
    }
  }
}

TEST_CASE("a plan with many stages is simulated in time linear in its size") {
  // Structural, not timed: count the collective parts the simulation visits.
  // Every stage reduces after itself; scanning all stages for each reduce
  // (quadratic) would visit about P x N x 2N parts, the linear simulation at
  // most 3 x 2 x (N casts + N reduce buckets) x P per pass.
  const int P = 4;
  const Problem p = problem(64, P);
  for (int N : {8, 256}) {
    CAPTURE(N);
    Plan plan = empty_plan(p, N);
    for (int s = 1; s <= N; ++s)
      for (RankPlan& r : plan.ranks)
        for (PassPlan* pp : {&r.fwd, &r.bwd}) pp->comm.stages[static_cast<std::size_t>(s - 1)].qo_reduce_after = s;
    TimingWorkspace ws;
    estimate_step(p, plan, profile(true), ws);
    const std::int64_t bound = 2 /*passes*/ * 3 * 2 * (2 * std::int64_t{N}) * P;
    CHECK(ws.parts_visited() <= bound);
    CHECK(ws.parts_visited() >= 2 * 2 * std::int64_t{N} * P);  // every part once at least
  }
}

TEST_CASE("the sim report prints the compute bound and step / bound next to the step time") {
  // Rank 0 computes 32 x 32 cells, rank 1 nothing: the step is rank 0's
  // compute, the bound half of it, so step / bound = 2.00.
  const Problem p = problem(64, 2);
  Plan plan = empty_plan(p);
  plan.ranks[0].fwd.calc.local_attn_args = {local(32)};
  plan.ranks[0].bwd.calc.local_attn_args = {local(32)};
  const HardwareProfile hw = profile(true);
  const Timeline t = simulate_timeline(p, plan, hw);
  const PassStats f = pass_stats(t.fwd), b = pass_stats(t.bwd);
  ReportInputs in;
  in.problem = &p;
  in.mode = "timing";
  in.hardware = &hw;
  in.fwd = &f;
  in.bwd = &b;
  in.compute_bound = compute_bound(p, plan, hw);
  const double step = f.time + b.time;
  CHECK(in.compute_bound == doctest::Approx(step / 2).epsilon(1e-12));
  const std::string text = report_text(in);
  CHECK(text.find(fmt::format("step time (fwd + bwd): {:.4f} ms; compute bound {:.4f} ms; step / bound 2.00\n",
                              step * 1e3, step / 2 * 1e3)) != std::string::npos);
  const auto figs = report_figures(in);
  auto fig = [&](const std::string& k) {
    for (const auto& [name, v] : figs)
      if (name == k) return v;
    FAIL("no figure " << k);
    return 0.0;
  };
  CHECK(fig("step_time_ms") == doctest::Approx(step * 1e3));
  CHECK(fig("compute_bound_ms") == doctest::Approx(step / 2 * 1e3));
  CHECK(fig("step_over_bound") == doctest::Approx(2.0));
}
