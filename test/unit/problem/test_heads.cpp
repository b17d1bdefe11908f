// Head geometry beyond GQA (docs/heads.md): MLA's d_qk,
// d_v and a latent KV row shared by K and V give Q, O, K and V rows their
// true bytes in the metrics, the time prices, the plan JSON and the config;
// GQA stays as docs/design.md#metrics has it.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "cpsched/plan/builder.hpp"
#include "cpsched/config/config.hpp"
#include "cpsched/plugin/cost_model.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/problem/metrics.hpp"
#include "cpsched/plan/cache.hpp"
#include "cpsched/io/plan_json.hpp"
#include "cpsched/timing/model.hpp"
#include "test_helpers.hpp"

using namespace cpsched;
using test::error_of;
using json = nlohmann::json;

namespace {

// DeepSeek's DSA: MLA in MQA mode, 128 q heads over one 576-dim latent.
const Heads kMla{128, 1, 576, 2, 512, true};
const Heads kGqa{64, 8, 128, 2};

Problem full_problem(Token S, int P, Heads h) {
  return Problem::make(RangeMask(S, {{{0, S}, {0, S}, MaskType::full}}), P, h, {true, 1});
}

// Every task of the problem's grid on rank 0.
Assignment all_on_rank0(Problem p) {
  Assignment a;
  a.grid = std::make_shared<const TaskGrid>(std::make_shared<const Problem>(std::move(p)));
  a.rank.assign(static_cast<std::size_t>(a.grid->num_tasks()), 0);
  return a;
}

std::string parse_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { parse_config(yaml, "t.yaml", overrides); });
}

}  // namespace

TEST_CASE("row bytes and FLOPs per pair of the head geometries") {
  CHECK(kMla.dqk() == 576);
  CHECK(kMla.dv() == 512);
  CHECK_FALSE(kMla.is_gqa());
  CHECK(kMla.q_row_bytes() == 1152);
  CHECK(kMla.o_row_bytes() == 1024);
  CHECK(kMla.k_row_bytes() == 1152);
  CHECK(kMla.v_row_bytes() == 0);  // V is a view of the latent
  CHECK(kMla.kv_row_bytes() == 1152);
  CHECK(kMla.fwd_flops_per_pair() == 2 * 576 + 2 * 512);
  CHECK(kMla.bwd_flops_per_pair() == 6 * 576 + 4 * 512);

  CHECK(kGqa.is_gqa());
  CHECK(kGqa.dv() == 128);
  CHECK(kGqa.kv_row_bytes() == 2 * 128 * 2);
  CHECK(kGqa.fwd_flops_per_pair() == 4 * 128);  // the 4 x D the code always used
  CHECK(kGqa.bwd_flops_ratio() == 2.5);         // exactly
  Heads same = kGqa;
  same.dim_v = 128;  // written out: the same geometry
  CHECK(same.is_gqa());
  Heads apart = kMla;
  apart.kv_shared = false;
  CHECK(apart.kv_row_bytes() == (576 + 512) * 2);
}

TEST_CASE("bytes per token: MLA by hand, GQA as docs/design.md#metrics") {
  const Problem mla = full_problem(64, 2, kMla);  // one head group: h = 128, h' = 1
  const TransferBytes f = fwd_bytes_per_token(mla), b = bwd_bytes_per_token(mla);
  CHECK(f.qo_out == 128 * 576 * 2);                      // Q: 147456
  CHECK(f.qo_back == 128 * (512 * 2 + 4));               // O + lse: 131584
  CHECK(f.kv_out == 576 * 2);                            // the latent: 1152
  CHECK(f.kv_back == 0);
  CHECK(b.qo_out == 128 * ((576 + 2 * 512) * 2 + 4));    // Q, O, dO, lse: 410112
  CHECK(b.qo_back == 128 * 576 * 2);                     // dQ
  CHECK(b.kv_out == 576 * 2);
  CHECK(b.kv_back == 576 * 2);                           // one latent gradient
  CHECK(f.qo_out == 128 * f.kv_out);                     // why the planner must keep Q home

  Heads apart = kMla;
  apart.kv_shared = false;
  const Problem sep = full_problem(64, 2, apart);
  CHECK(fwd_bytes_per_token(sep).kv_out == (576 + 512) * 2);
  CHECK(bwd_bytes_per_token(sep).kv_back == (576 + 512) * 2);

  const Problem gqa = full_problem(64, 2, kGqa);  // flattened: h = 8, h' = 1 per task
  const Bytes db = 128 * 2;
  const TransferBytes g = fwd_bytes_per_token(gqa), gb = bwd_bytes_per_token(gqa);
  CHECK(g.qo_out == 8 * db);
  CHECK(g.qo_back == 8 * (db + 4));
  CHECK(g.kv_out == 2 * db);
  CHECK(g.kv_back == 0);
  CHECK(gb.qo_out == 8 * (3 * db + 4));
  CHECK(gb.qo_back == 8 * db);
  CHECK(gb.kv_out == 2 * db);
  CHECK(gb.kv_back == 2 * db);
}

TEST_CASE("metrics of a placement with MLA rows, to the byte") {
  // Full mask, S = 4, P = 2: rank 0 computes every cell, so rank 1 sends its
  // two Q rows and its two latent rows, and gets O + lse back (forward);
  // backward adds O, dO, lse out and dQ, dKV back.
  const Assignment a = all_on_rank0(full_problem(4, 2, kMla));
  const Metrics m = compute_metrics(a);
  CHECK(m.fwd.send[1] == 2 * 147456 + 2 * 1152);
  CHECK(m.fwd.recv[0] == 2 * 147456 + 2 * 1152);
  CHECK(m.fwd.send[0] == 2 * 131584);
  CHECK(m.bwd.send[1] == 2 * 410112 + 2 * 1152);
  CHECK(m.bwd.send[0] == 2 * 147456 + 2 * 1152);
  CHECK(m.fwd.bottleneck == 2 * 147456 + 2 * 1152);
}

TEST_CASE("FLOPs and time prices follow the geometry; GQA keeps 4 D and 2.5x") {
  HardwareProfile hw;
  hw.fwd_tflops = 500;
  hw.bwd_tflops = 400;
  // One full 8 x 8 arg: FLOPs = 64 pairs x q heads x FLOPs per pair.
  PassPlan pp;
  pp.calc.local_attn_args.push_back({{0, 8}, {0, 8}, MaskType::full, BufferId::local, BufferId::local, 0});
  const Problem mla = full_problem(8, 1, kMla);
  CHECK(compute_seconds(mla, pp, hw, Pass::fwd) == doctest::Approx(64.0 * 128 * (2 * 576 + 2 * 512) / 500e12));
  CHECK(compute_seconds(mla, pp, hw, Pass::bwd) == doctest::Approx(64.0 * 128 * (6 * 576 + 4 * 512) / 400e12));
  const Problem gqa = full_problem(8, 1, kGqa);  // a group: 8 q heads
  CHECK(compute_seconds(gqa, pp, hw, Pass::fwd) == 4.0 * 64 * 8 * 128 / 500e12);
  CHECK(compute_seconds(gqa, pp, hw, Pass::bwd) == 2.5 * (4.0 * 64 * 8 * 128) / 400e12);

  hw.intra_node.bandwidth_gb_s = 400;
  hw.inter_node.bandwidth_gb_s = 50;
  hw.gpus_per_node = 8;
  const TimeCostModel cost(hw);
  auto grid = std::make_shared<const TaskGrid>(std::make_shared<const Problem>(full_problem(64, 2, kMla)));
  const double fwd = static_cast<double>(grid->load(0)) * (2 * 576 + 2 * 512);
  CHECK(cost.compute(*grid, 0) == doctest::Approx(fwd / 500e12 + fwd * (6 * 576 + 4 * 512) / (2 * 576 + 2 * 512) / 400e12));
  // QO of one token costs 128 q heads' Q, O, dO, dQ rows; KV one latent both ways.
  const double qo = cost.transfer(*grid, RowKind::qo, 1, 128, 0, 1);
  const double kv = cost.transfer(*grid, RowKind::kv, 1, 1, 0, 1);
  CHECK(qo == doctest::Approx((147456.0 + 131584 + 410112 + 147456) / 400e9));
  CHECK(kv == doctest::Approx((1152.0 * 3) / 400e9));
}

TEST_CASE("USP's closed form counts d_qk and d_v rows") {
  // Ring only (u = 1, one kv head): per rank (S/P) x latent bytes x (P - 1).
  const Problem mla = full_problem(64, 4, kMla);
  CHECK(usp_closed_form_fwd_bytes_per_rank(mla, 1) == doctest::Approx(16.0 * 1152 * 3));
  // GQA: docs/design.md#metrics's formula.
  const Problem gqa = full_problem(64, 4, kGqa);
  const double expect = 16.0 * 128 * 2 * (2 * 64.0 * 3 / 4 + 2 * 8.0 * 3 / 4 + 2 * 8.0 * 0);
  CHECK(usp_closed_form_fwd_bytes_per_rank(gqa, 4) == expect);
}

TEST_CASE("Problem::validate: precise errors for d_v and the shared latent") {
  Problem p = full_problem(16, 2, kMla);
  CHECK_NOTHROW(p.validate());
  p.heads.dim_v = -1;
  CHECK(error_of([&] { p.validate(); }) == "heads: dim_v must be at least 0 (0: same as dim), got -1");
  p.heads.dim_v = 600;
  CHECK(error_of([&] { p.validate(); }) ==
        "heads: kv_shared needs dim_v <= dim (V is the first dim_v dims of the latent K row), got dim_v 600 > dim 576");
  p.heads.kv_shared = false;  // separate K and V may be wider than Q and K
  CHECK_NOTHROW(p.validate());
}

TEST_CASE("plan JSON: head_dim_v and kv_shared only for non-GQA geometry") {
  for (const Heads& h : {kGqa, kMla}) {
    const Assignment a = all_on_rank0(full_problem(16, 2, h));
    const Metrics m = compute_metrics(a);
    PlanExport e;
    e.assignment = &a;
    e.metrics = &m;
    e.solver = "test";
    const json doc = json::parse(plan_json(e));
    const json& pj = doc.at("problem");
    CHECK(pj.at("head_dim") == h.dim);
    if (h.is_gqa()) {
      CHECK_FALSE(pj.contains("head_dim_v"));
      CHECK_FALSE(pj.contains("kv_shared"));
    } else {
      CHECK(pj.at("head_dim_v") == 512);
      CHECK(pj.at("kv_shared") == true);
    }
  }
}

TEST_CASE("the plan cache tells MLA from GQA of the same d_qk") {
  Heads a{8, 1, 64, 2}, b = a;
  b.dim_v = 32;
  b.kv_shared = true;
  const Problem pa = full_problem(16, 2, a), pb = full_problem(16, 2, b);
  CHECK_FALSE(make_plan_key(pa, "s", {}, "c", {}, PlanShape::fixed(1, 0)) == make_plan_key(pb, "s", {}, "c", {}, PlanShape::fixed(1, 0)));
  Heads c = a;
  c.dim_v = 64;  // GQA written out: the same key
  CHECK(make_plan_key(pa, "s", {}, "c", {}, PlanShape::fixed(1, 0)) == make_plan_key(full_problem(16, 2, c), "s", {}, "c", {}, PlanShape::fixed(1, 0)));
}

TEST_CASE("config: dim_qk, dim_v, kv_shared, their --set forms and errors") {
  const Config c = parse_config(
      "problem:\n"
      "  cp_size: 2\n"
      "  heads: {q: 128, kv: 1, dim_qk: 576, dim_v: 512, kv_shared: true}\n",
      "t.yaml");
  CHECK(c.heads.dim == 576);
  CHECK(c.heads.dim_v == 512);
  CHECK(c.heads.kv_shared);
  const Problem p = make_problem(c);
  CHECK(fwd_bytes_per_token(p).kv_out == 1152);

  const Config s = parse_config("problem: {cp_size: 2}\n", "t.yaml",
                                {"problem.heads.q=128", "problem.heads.kv=1", "problem.heads.dim=576",
                                 "problem.heads.dim_v=512", "problem.heads.kv_shared=true"});
  CHECK(s.heads.dim == 576);
  CHECK(s.heads.dv() == 512);
  CHECK(s.heads.kv_shared);

  // Defaults stay GQA.
  CHECK(parse_config("problem: {cp_size: 2}\n", "t.yaml").heads.is_gqa());
  // dim and dim_qk agreeing is fine.
  CHECK(parse_config("problem: {heads: {dim: 64, dim_qk: 64}}\n", "t.yaml").heads.dim == 64);

  CHECK(parse_error("problem:\n  heads: {dim: 64, dim_qk: 72}\n") ==
        "t.yaml:2:28: problem.heads.dim_qk: dim_qk = 72 differs from dim = 64; both name d_qk (Q and K head dim): "
        "give one of them");
  CHECK(parse_error("problem:\n  heads: {dim: 64, dim_v: 96, kv_shared: true}\n") ==
        "t.yaml:2:27: problem.heads.dim_v: kv_shared: V is the first dim_v dims of the latent K row, so dim_v = 96 "
        "must be at most dim = 64");
  CHECK(parse_error("problem:\n  heads: {dim_v: -1}\n").find("problem.heads.dim_v: must be >= 0, got -1") !=
        std::string::npos);
  CHECK(parse_error("problem:\n  heads: {kv_shared: 3}\n").find("problem.heads.kv_shared") != std::string::npos);
  const std::string unknown = parse_error("problem:\n  heads: {dim_k: 3}\n");
  CHECK(unknown.find("problem.heads.dim_k") != std::string::npos);
  CHECK(unknown.find("dim_v") != std::string::npos);  // the known keys are listed
}
