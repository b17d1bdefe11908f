// The sim runtime's timing model on hand-made plans whose times follow from
// the profile by hand: compute alone, one transfer, overlap, the reduce, and
// the figures derived from a timeline.
#include <doctest/doctest.h>

#include <cmath>

#include "cpsched/error.hpp"
#include "cpsched/metrics.hpp"
#include "gantt_svg.hpp"
#include "cpsched/hardware.hpp"
#include "cpsched/timing.hpp"
#include "cpsched/timing_stats.hpp"

using namespace cpsched;
using namespace cpsched::sim;

namespace {

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

TEST_CASE("splits to one peer pay one latency; peers in parallel do not add up") {
  const Problem p = problem(96, 3);
  Plan plan = empty_plan(p);
  add_kv_transfer(plan, 1, 0, 10, false);
  add_kv_transfer(plan, 1, 0, 10, false);  // second split, same peer: one message
  const HardwareProfile hw = profile(true);
  const double per_tok = static_cast<double>(fwd_bytes_per_token(p).kv_out);
  const double one_msg = 5e-6 + 20 * per_tok / 200e9;
  CHECK(simulate_timeline(p, plan, hw).fwd.makespan() == doctest::Approx(one_msg).epsilon(1e-12));
  // Rank 0 now also receives from rank 2: its receive link serializes both.
  add_kv_transfer(plan, 2, 0, 10, false);
  const double two_msgs = 2 * 5e-6 + 30 * per_tok / 200e9;
  CHECK(simulate_timeline(p, plan, hw).fwd.makespan() == doctest::Approx(two_msgs).epsilon(1e-12));
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
