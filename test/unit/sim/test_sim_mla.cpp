// MLA head geometry in the sim runtime (docs/heads.md, "Runtimes"): the CPU kernel
// computes QK^T over d_qk and PV / O / dO over d_v, a shared latent makes V
// the first d_v dims of K and sums dK and dV into one gradient; plans of
// every solver executed on virtual ranks equal the dense reference.
#include <doctest/doctest.h>

#include <memory>
#include <random>

#include "attention_kernel.hpp"
#include "host_solve.hpp"
#include "cpsched/plugin/cost_model.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "cpsched/plan/builder.hpp"
#include "cpsched/plugin/registry.hpp"
#include "global_tensors.hpp"
#include "naive_attention.hpp"
#include "naive_mla.hpp"
#include "random_specs.hpp"
#include "sim_outcome.hpp"

using namespace cpsched;
using namespace cpsched::sim;
using cpsched::sim::test::MlaShape;
using cpsched::sim::test::naive_mla;
using cpsched::sim::test::random_floats;
using cpsched::sim::test::rel_err;

namespace {

// Kernel shapes: MQA with a shared latent (DSA's layout, small), a shared
// latent under GQA, and separate K / V with d_v < d_qk.
const MlaShape kShapes[] = {{4, 1, 24, 16, true}, {4, 2, 24, 16, true}, {4, 2, 24, 16, false}, {2, 1, 16, 24, false}};

KernelShape kernel_shape(const MlaShape& s) { return {s.hq, s.hkv, s.dqk, s.dv, s.shared}; }

}  // namespace

TEST_CASE("the kernel with MLA geometry equals the naive double-precision reference") {
  // 70 x 130 crosses q tiles (32) and k tiles (64).
  const Token lq = 70, lk = 130;
  for (const MlaShape& s : kShapes)
    for (MaskType t : {MaskType::full, MaskType::causal, MaskType::inv_causal, MaskType::bi_causal})
      for (int threads : {1, 3}) {
        CAPTURE(s.hq);
        CAPTURE(s.hkv);
        CAPTURE(s.dqk);
        CAPTURE(s.dv);
        CAPTURE(s.shared);
        CAPTURE(to_string(t));
        CAPTURE(threads);
        const auto q = random_floats(static_cast<std::size_t>(lq * s.hq * s.dqk), 1);
        const auto k = random_floats(static_cast<std::size_t>(lk * s.hkv * s.dqk), 2);
        const auto v = s.shared ? std::vector<float>{} : random_floats(static_cast<std::size_t>(lk * s.v_row()), 3);
        const auto d_o = random_floats(static_cast<std::size_t>(lq * s.hq * s.dv), 4);
        const auto ref = naive_mla(s, q, k, v, d_o, lq, lk, t);

        const KernelShape shape = kernel_shape(s);
        const std::int64_t qw = std::int64_t{s.hq} * s.dqk, ow = std::int64_t{s.hq} * s.dv;
        const std::int64_t kw = std::int64_t{s.hkv} * s.dqk, vw = s.v_row();
        const CView qv{q.data(), qw}, kv{k.data(), kw};
        const CView vv = s.shared ? kv : CView{v.data(), vw};
        const Slice arg{{0, lq}, {0, lk}, t};
        const Partial part = attention_forward(shape, qv, kv, vv, arg, threads);
        REQUIRE(part.dim == s.dv);
        REQUIRE(part.o.size() == ref.o.size());
        CHECK(rel_err(part.o, ref.o) <= 1e-5);
        for (std::size_t n = 0; n < ref.lse.size(); ++n)
          if (std::isinf(ref.lse[n])) REQUIRE(std::isinf(part.lse[n]));
          else REQUIRE(std::abs(part.lse[n] - ref.lse[n]) <= 1e-5 * std::max(1.0, std::abs(ref.lse[n])));

        std::vector<float> dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f);
        const MView dkv{dk.data(), kw};
        const BackwardInputs in{qv, kv, vv, part.o_view(), CView{d_o.data(), ow}, part.lse_view()};
        const BackwardOutputs out{MView{dq.data(), qw}, dkv, s.shared ? dkv : MView{dv.data(), vw}};
        attention_backward(shape, in, out, arg, threads);
        CHECK(rel_err(dq, ref.dq) <= 1e-4);
        CHECK(rel_err(dk, ref.dk) <= 1e-4);  // shared: the latent's whole gradient
        if (!s.shared) CHECK(rel_err(dv, ref.dv) <= 1e-4);
      }
}

TEST_CASE("a shared latent's gradient is dK plus dV in its first d_v dims") {
  // The same inputs as separate K and V = K[:, :d_v] give dK and dV whose sum
  // (dV padded) is the shared run's latent gradient.
  const MlaShape shared{4, 1, 24, 16, true}, apart{4, 1, 24, 16, false};
  const Token lq = 40, lk = 40;
  const auto q = random_floats(static_cast<std::size_t>(lq * 4 * 24), 5);
  const auto k = random_floats(static_cast<std::size_t>(lk * 24), 6);
  std::vector<float> v;
  for (Token j = 0; j < lk; ++j) v.insert(v.end(), k.begin() + j * 24, k.begin() + j * 24 + 16);
  const auto d_o = random_floats(static_cast<std::size_t>(lq * 4 * 16), 7);
  const auto a = naive_mla(shared, q, k, {}, d_o, lq, lk, MaskType::causal);
  const auto b = naive_mla(apart, q, k, v, d_o, lq, lk, MaskType::causal);
  CHECK(rel_err(a.o, b.o) <= 1e-12);
  std::vector<double> sum = b.dk;
  for (Token j = 0; j < lk; ++j)
    for (int d = 0; d < 16; ++d) sum[static_cast<std::size_t>(j * 24 + d)] += b.dv[static_cast<std::size_t>(j * 16 + d)];
  CHECK(rel_err(a.dk, sum) <= 1e-12);
  CHECK(a.dv.empty());
}

TEST_CASE("the kernel rejects a shared latent narrower than d_v") {
  const std::vector<float> x(64, 0.5f);
  const KernelShape bad{2, 1, 8, 16, true};
  CHECK_THROWS_AS(attention_forward(bad, CView{x.data(), 16}, CView{x.data(), 8}, CView{x.data(), 8},
                                    Slice{{0, 2}, {0, 2}, MaskType::full}),
                  Error);
}

namespace {

struct Solvers {
  Registry reg;
  AreaCostModel cost;
  std::vector<std::pair<std::string, std::unique_ptr<Solver>>> list;
  Solvers() {
    reg.scan(CPSCHED_PLUGIN_BUILD_DIR);
    for (const std::string name : {"owner", "usp", "static", "binary_greedy", "balanced_bytes"}) {
      const PluginInfo* info = nullptr;
      for (const PluginInfo& p : reg.plugins())
        if (p.kind == PluginKind::solver && p.name == name) info = &p;
      if (info == nullptr) {
        MESSAGE("solver '", name, "' is not built in ", CPSCHED_PLUGIN_BUILD_DIR, ": skipped");
        continue;
      }
      list.emplace_back(name, reg.make_solver(name, reg.resolve_params(*info, {})));
    }
  }
};

}  // namespace

TEST_CASE("plans of every solver with MLA geometry equal the dense reference (P 2-4, stages 1-2)") {
  Solvers solvers;
  REQUIRE(!solvers.list.empty());
  std::mt19937_64 rng(13);
  int runs = 0;
  // MQA latent (DSA-like, small), a shared latent with 2 kv heads, separate K / V.
  const Heads geometries[] = {Heads{4, 1, 24, 2, 16, true}, Heads{4, 2, 24, 2, 16, true},
                              Heads{4, 2, 24, 2, 16, false}};
  for (const Heads& heads : geometries)
    for (auto& [name, solver] : solvers.list)
      for (MaskKind kind : {MaskKind::causal_document, MaskKind::full, MaskKind::sliding_window})
        for (int P : {2, 3, 4}) {
          auto grid = cpsched::test::random_grid(kind, P, heads, rng);
          const Solution a_sol = cpsched::test::host_solve(*solver, grid, solvers.cost);
          const Assignment& a = a_sol.assignment;
          for (int stages : {1, 2}) {
            CAPTURE(name);
            CAPTURE(heads.kv);
            CAPTURE(heads.kv_shared);
            CAPTURE(static_cast<int>(kind));
            CAPTURE(P);
            CAPTURE(stages);
            const cpsched::test::Outcome o = cpsched::test::run_numeric(grid->problem(), build_plan(a, stages));
            INFO(o.str());
            CHECK(o.passed());
            ++runs;
          }
        }
  MESSAGE(runs, " MLA plans checked numerically");
}

TEST_CASE("GQA written with dim_v = dim is the same geometry, bit for bit") {
  std::mt19937_64 rng(3);
  auto grid = cpsched::test::random_grid(MaskKind::causal_document, 3, Heads{4, 2, 8, 2}, rng);
  Problem explicit_v = grid->problem();
  explicit_v.heads.dim_v = 8;
  CHECK(explicit_v.heads.is_gqa());
  const GlobalInputs a = GlobalInputs::generate(grid->problem(), 11), b = GlobalInputs::generate(explicit_v, 11);
  CHECK(a.q == b.q);
  CHECK(a.k == b.k);
  CHECK(a.v == b.v);
  CHECK(a.d_o == b.d_o);
}
