// Index args (token top-k) on the tensor-core programs' CPU twin
// (host/programs/index_programs.hpp): whole plans through the emulate backend against
// the sim runtime and its dense reference, across query heads per kv head.
#include <doctest/doctest.h>

#include <random>

#include "index_checks.hpp"

using namespace cpsched;
using test::Checked;
using test::count_index_args;
using test::dsa_mask;
using test::run_and_check;

TEST_CASE("index args on tensor cores: 1 to 128 query heads per kv head (one or more 16- and 64-head blocks)") {
  // The MMA rows of the q-major programs are one row's query heads of a kv
  // head: 16 per block up to 16 of them, else blocks of 64; k-major pairs
  // (row, head) 64 at a time whatever the count.
  std::mt19937_64 rng(59);
  struct Case {
    int hq, hkv, dim, P, stages;
    std::uint64_t placement;
  };
  const Case cases[] = {{16, 1, 16, 2, 1, 3}, {32, 2, 16, 3, 2, 5}, {128, 1, 16, 2, 1, 7}, {24, 1, 32, 2, 2, 0}};
  for (const Case& k : cases) {
    const Token S = 60 * k.P + static_cast<Token>(rng() % 20);
    auto c = test::make_index_plan_case(dsa_mask(S, {S / 2, S - S / 2}, rng()), k.P, Heads{k.hq, k.hkv, k.dim, 2},
                                        GridOptions{true, 1}, k.stages, k.placement);
    INFO("heads ", k.hq, ":", k.hkv, " D=", k.dim, " P=", k.P);
    REQUIRE(count_index_args(c.plan, false) > 0);
    const Checked res = run_and_check(c);
    INFO(res.plan.text, "; dense reference: ", res.dense_error);
    CHECK(res.passed());
    CHECK(res.dense_error < 5e-3);
  }
}

TEST_CASE("index args with MLA heads: d_qk 48 / d_v 32 and 576 / 512, V apart or inside a shared latent (dK = dK + dV)") {
  // DSA's geometry at a CI size: the latent row is K, its first d_v columns
  // V; the programs gather it once per key and add dV into its gradient.
  std::mt19937_64 rng(61);
  // 576 / 512 with 32 heads: the GPU's MLA variant (32 heads per block,
  // half steps; index_mt, index_step), whose twin runs the same program.
  struct Case {
    int hq, hkv, P, stages;
    bool shared;
    std::uint64_t placement;
    int dim = 48, dim_v = 32;
  };
  const Case cases[] = {{16, 1, 2, 1, true, 3}, {32, 1, 3, 2, true, 5}, {8, 2, 2, 2, false, 0},
                        {32, 1, 2, 1, true, 7, 576, 512}};
  for (const Case& k : cases) {
    const Token S = (k.dim > 256 ? 20 : 60) * k.P + static_cast<Token>(rng() % 20);
    auto c = test::make_index_plan_case(dsa_mask(S, {S / 2, S - S / 2}, rng()), k.P,
                                        Heads{k.hq, k.hkv, k.dim, 2, k.dim_v, k.shared}, GridOptions{true, 1},
                                        k.stages, k.placement);
    INFO("heads ", k.hq, ":", k.hkv, " dims ", k.dim, "/", k.dim_v, " shared=", k.shared, " P=", k.P);
    REQUIRE(count_index_args(c.plan, false) > 0);
    const Checked res = run_and_check(c);
    INFO(res.plan.text, "; dense reference: ", res.dense_error);
    CHECK(res.passed());
    CHECK(res.dense_error < 5e-3);
  }
}
