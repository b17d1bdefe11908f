// Head geometry in the CUDA runtime's host side (docs/heads.md): its kernels
// and buffers hold one head dim for Q, K, V and O, so MLA geometry (d_v !=
// d_qk, or V inside K's latent row) is refused up front with an error naming
// it, on the emulated backend as on GPUs; GQA written with dim_v = dim runs.
#include <doctest/doctest.h>

#include <random>

#include "brute_force.hpp"
#include "cpsched/base/error.hpp"
#include "host/layout.hpp"
#include "host/rank_run.hpp"
#include "plans.hpp"

using namespace cpsched;
namespace g = cpsched::gpu;

namespace {

g::RunOptions emulated() {
  Params p;
  p.set("backend", std::string("emulate"));
  p.set("check", true);
  return g::parse_run_options(p);
}

std::string error_of_run(const Heads& h) {
  std::mt19937_64 rng(3);
  auto c = test::make_plan_case(test::random_document_mask(96, rng), 2, h, GridOptions{true, 1}, 1, 5);
  try {
    g::run_emulated(*c.problem, c.plan, emulated(), 11);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("MLA geometry is refused before any buffer is sized, naming d_qk, d_v and the latent") {
  CHECK(error_of_run(Heads{4, 1, 24, 2, 16, true}) ==
        "cuda_nccl: MLA head geometry (d_qk 24, d_v 16, shared KV latent) is not supported: its kernels and buffers "
        "are built for GQA (one head dim for Q, K, V and O); run it on the sim executor");
  CHECK(error_of_run(Heads{4, 2, 16, 2, 8, false}).find("(d_qk 16, d_v 8)") != std::string::npos);
}

TEST_CASE("GQA written with dim_v = dim is GQA: the layout and the emulated run are as before") {
  const Heads h{4, 2, 16, 2, 16, false};
  std::mt19937_64 rng(3);
  auto c = test::make_plan_case(test::random_document_mask(96, rng), 2, h, GridOptions{true, 1}, 1, 5);
  const g::HeadLayout l = g::HeadLayout::of(*c.problem);
  CHECK(l.dim == 16);
  CHECK(l.local_row_bytes(g::Tensor::v) == 2 * 16 * 2);
  const ExecutionReport rep = g::run_emulated(*c.problem, c.plan, emulated(), 11);
  INFO(rep.text);
  CHECK(rep.passed);
}
