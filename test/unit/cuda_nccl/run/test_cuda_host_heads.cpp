// Head geometry in the CUDA runtime's host side (docs/heads.md): GQA, and MLA
// with d_qk != d_v, apart or with K and V in one shared latent row, run end
// to end on the CPU emulation (range args as index rows on the index
// programs, as on the GPU, counted under index_rows) and match the sim; the
// buffers, transfers and outputs carry d_qk, d_v and the latent as the
// byte table of docs/heads.md says. Head dims without a kernel are refused
// with both dims named.
#include <doctest/doctest.h>

#include <random>

#include "brute_force.hpp"
#include "cpsched/base/error.hpp"
#include "host/plan/buffers.hpp"
#include "host/plan/layout.hpp"
#include "host/run/rank_run.hpp"
#include "plans.hpp"

using namespace cpsched;
namespace g = cpsched::gpu;

namespace {

g::RunOptions emulated() {
  Params p;
  p.set("backend", std::string("emulate"));
  p.set("check", true);
  p.set("threads", std::int64_t{2});
  return g::parse_run_options(p);
}

test::PlanCase mla_case(const Heads& h, int P, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  return test::make_plan_case(test::random_document_mask(96, rng), P, h, GridOptions{true, 1}, 2, 5);
}

}  // namespace

TEST_CASE("MLA layout: d_qk for Q, K, dQ, dK; d_v for V, O, dO, dV; a shared latent moves K and dK alone") {
  const g::HeadLayout a = g::HeadLayout::of(*mla_case(Heads{4, 2, 48, 2, 32, false}, 2, 3).problem);
  CHECK(a.dim == 48);
  CHECK(a.dim_v == 32);
  CHECK(a.local_row_bytes(g::Tensor::q) == 4 * 48 * 2);
  CHECK(a.local_row_bytes(g::Tensor::o) == 4 * 32 * 2);
  CHECK(a.local_row_bytes(g::Tensor::k) == 2 * 48 * 2);
  CHECK(a.local_row_bytes(g::Tensor::v) == 2 * 32 * 2);
  CHECK(a.local_row_bytes(g::Tensor::dv) == 2 * 32 * 2);
  CHECK(g::cast_tensors(g::Pass::fwd, RowKind::kv, a.shared).size() == 2);

  const g::HeadLayout s = g::HeadLayout::of(*mla_case(Heads{4, 1, 48, 2, 32, true}, 2, 3).problem);
  CHECK(s.shared);
  CHECK(s.v_stride() == 48);
  const auto cast = g::cast_tensors(g::Pass::bwd, RowKind::kv, true);
  const auto back = g::reduce_tensors(g::Pass::bwd, RowKind::kv, true);
  REQUIRE(cast.size() == 1);
  REQUIRE(back.size() == 1);
  CHECK(cast[0] == g::Tensor::k);
  CHECK(back[0] == g::Tensor::dk);
  // Local buffers: no V and no dV with a shared latent.
  g::LocalBuffers lb;
  Bytes v = -1, dv = -1, o = -1;
  g::visit_local(lb, s, 10, [&](const char* name, Bytes n, auto&) {
    if (std::string(name) == "v") v = n;
    if (std::string(name) == "dv_acc") dv = n;
    if (std::string(name) == "o") o = n;
  });
  CHECK(v == 0);
  CHECK(dv == 0);
  CHECK(o == 10 * 4 * 32 * 2);
}

TEST_CASE("MLA heads run end to end on the emulation and match the sim (d_qk 48, d_v 32; apart and shared)") {
  for (const bool shared : {false, true})
    for (const int P : {1, 2, 3}) {
      const Heads h{8, shared ? 1 : 2, 48, 2, 32, shared};
      auto c = mla_case(h, P, 5 + static_cast<std::uint64_t>(P));
      const ExecutionReport rep = g::run_emulated(*c.problem, c.plan, emulated(), 11);
      INFO("shared=", shared, " P=", P, ": ", rep.text);
      CHECK(rep.passed);
      CHECK(rep.text.find(shared ? "dLatent (dK + dV)" : "dV ") != std::string::npos);
      // Range args: MLA is outside cuDNN's SDPA; all of them ran as index rows, counted as such.
      CHECK(rep.figures.get("fwd_cudnn_args").value_or(-1) == 0);
      CHECK(rep.figures.get("fwd_kernel_args").value_or(0) > 0);
      CHECK(rep.text.find("index_rows") != std::string::npos);
      CHECK(rep.text.find("heads ") == std::string::npos);
    }
}

// DSA's geometry (576 / 512, one shared latent row) on a range mask: the
// range args run on the same index programs as the CUDA backend's (the CPU
// twins), each row's keys as index rows, and match the sim.
TEST_CASE("MLA 576 / 512 shared latent: causal_document range args as index rows match the sim (P = 1, 2)") {
  for (const int P : {1, 2}) {
    const Heads h{16, 1, 576, 2, 512, true};
    auto c = test::make_plan_case(test::generated_mask(MaskKind::causal_document, 64, {40, 24}), P, h,
                                  GridOptions{true, 1}, 2, 7);
    const ExecutionReport rep = g::run_emulated(*c.problem, c.plan, emulated(), 13);
    INFO("P=", P, ": ", rep.text);
    CHECK(rep.passed);
    CHECK(rep.text.find("dLatent (dK + dV)") != std::string::npos);
    CHECK(rep.figures.get("fwd_cudnn_args").value_or(-1) == 0);
    CHECK(rep.figures.get("fwd_kernel_args").value_or(0) > 0);
    CHECK(rep.text.find("index_rows") != std::string::npos);
  }
}

TEST_CASE("MLA dims without a kernel are refused naming both dims; GQA written with dim_v = dim is GQA") {
  auto c = mla_case(Heads{4, 1, 24, 2, 16, true}, 2, 3);
  CHECK_THROWS_WITH_AS(g::run_emulated(*c.problem, c.plan, emulated(), 11),
                       doctest::Contains("head dims d_qk 24 / d_v 16 have no kernel"), Error);

  const Heads h{4, 2, 16, 2, 16, false};
  std::mt19937_64 rng(3);
  auto d = test::make_plan_case(test::random_document_mask(96, rng), 2, h, GridOptions{true, 1}, 1, 5);
  const g::HeadLayout l = g::HeadLayout::of(*d.problem);
  CHECK(l.dim == 16);
  CHECK_FALSE(l.is_mla());
  CHECK(l.local_row_bytes(g::Tensor::v) == 2 * 16 * 2);
  const ExecutionReport rep = g::run_emulated(*d.problem, d.plan, emulated(), 11);
  INFO(rep.text);
  CHECK(rep.passed);
}
