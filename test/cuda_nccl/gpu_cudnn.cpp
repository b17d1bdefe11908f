// GPU test (label gpu; exit 77 without a device): range args on cuDNN's fused
// attention, on one GPU.
//  1. One batch per mask form and pass (sequences with Lq < Lk, Lq = Lk and
//     Lq > Lk, head groups, remote-style row strides), run by cuDNN on the
//     device and by its CPU twin (host/backend/sdpa_twin.hpp) on the same bf16
//     inputs: O and lse, or dQ, dK and dV, agree (cuDNN rounds P and dS to
//     bf16 for its products; the twin does not).
//  2. What cuDNN writes for a query row that no key reaches (printed; the
//     runtime never gives it such a row, sdpa_batches.hpp).
//  3. Whole plans, P = 1..4 ranks as threads on device 0 (loopback), with
//     attention cudnn and kernels: both pass the sim self-check, agree with
//     each other, and the cuDNN path gives the same bits when run twice.
//  4. The executor with attention: cudnn on one rank, self-checked.
#include <cmath>
#include <cstdio>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <random>
#include <thread>

#include "brute_force.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "device/cuda_backend.hpp"
#include "device/cudnn_sdpa.hpp"
#include "device/executor.hpp"
#include "device/kernels.hpp"
#include "host/backend/sdpa_twin.hpp"
#include "host/run/check.hpp"
#include "host/run/emulate.hpp"
#include "host/run/inputs.hpp"
#include "plans.hpp"

using namespace cpsched;
using cpsched::gpu::i64;
namespace g = cpsched::gpu;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++failures;
}

// A device copy of a host vector, freed at scope exit.
template <class T>
struct DevBuf {
  T* p = nullptr;
  std::size_t n = 0;
  explicit DevBuf(const std::vector<T>& h) : n(h.size()) {
    void* raw = nullptr;
    g::cuda::check(cudaMalloc(&raw, std::max<std::size_t>(n, 1) * sizeof(T)), "cudaMalloc");
    p = static_cast<T*>(raw);
    if (n > 0) g::cuda::check(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~DevBuf() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    if (n > 0) g::cuda::check(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return h;
  }
};

std::vector<g::bf16> random_bf16(std::size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<g::bf16> v(n);
  for (auto& x : v) x = g::float_to_bf16(u(rng));
  return v;
}

double max_rel_bf16(const std::vector<g::bf16>& a, const std::vector<g::bf16>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(g::bf16_to_float(a[i])) - g::bf16_to_float(b[i])));
    den = std::max(den, std::abs(static_cast<double>(g::bf16_to_float(b[i]))));
  }
  return num / (den > 0 ? den : 1);
}

double max_abs(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

AttnArg arg(Token qb, Token qe, Token kb, Token ke, MaskType t, int group) {
  AttnArg a;
  a.q = {qb, qe};
  a.k = {kb, ke};
  a.type = t;
  a.group = group;
  return a;
}

// One batch on cuDNN and on the twin: both passes, the lse of the forward feeding the backward.
void batch_case(MaskType type, int dim, int group) {
  const g::HeadLayout h{16, 4, dim, group >= 0 ? 2 : 1, 2};
  const Token rows = 700;
  std::mt19937_64 rng(static_cast<std::uint64_t>(dim * 10 + static_cast<int>(type)));
  // Lq < Lk, Lq = Lk, Lq > Lk (bi_causal: Lk >= Lq, so that the band is not empty).
  std::vector<AttnArg> args = {arg(0, 130, 10, 300, type, group), arg(200, 456, 200, 456, type, group),
                               arg(500, 690, 320, 400, type, group)};
  if (type == MaskType::bi_causal) args[2] = arg(500, 560, 320, 400, type, group);
  PassPlan plan;
  plan.calc.local_attn_args = args;
  g::SdpaPolicy pol;
  pol.min_band_area = 1;
  pol.max_band_graphs = 8;
  const auto n = static_cast<std::size_t>(rows + g::kSdpaTailRows);
  const DevBuf<g::bf16> q(random_bf16(n * h.hq * dim, rng)), k(random_bf16(n * h.hkv * dim, rng)),
      v(random_bf16(n * h.hkv * dim, rng)), d_o(random_bf16(n * h.hq * dim, rng));
  cudaStream_t stream = nullptr;
  g::cuda::check(cudaStreamCreate(&stream), "cudaStreamCreate");
  g::cudnn::Runner runner(stream);
  const std::string name = fmt::format("cuDNN vs twin: {} D={} {}", to_string(type), dim,
                                       group >= 0 ? "head group 1" : "all heads");
  for (const g::Pass pass : {g::Pass::fwd, g::Pass::bwd}) {
    const g::PassSdpa sd = g::plan_sdpa(plan, pass, h, g::RemoteShape{}, rows, pol);
    for (const g::SdpaBatch& b : sd.batches[0]) {
      const g::SdpaOffsets off = g::sdpa_offsets(b);
      const g::SdpaScratch at = g::sdpa_scratch(b);
      const DevBuf<std::int32_t> q_off(off.q), k_off(off.k), oq(off.out_q), os(off.out_stats), ok(off.out_k),
          sq(off.seq_q), sk(off.seq_k);
      // Forward outputs of the same rows feed the backward (a stand-in for the merged O and lse).
      std::vector<float> stats_h(static_cast<std::size_t>(b.total_q * b.geo.q_heads));
      std::vector<g::bf16> o_h(n * h.hq * dim);
      {
        std::mt19937_64 r2(7);
        std::uniform_real_distribution<float> u(1.f, 4.f);
        for (auto& x : stats_h) x = u(r2);
        o_h = random_bf16(o_h.size(), r2);
      }
      const DevBuf<float> stats(stats_h);
      const DevBuf<g::bf16> o_in(o_h);
      DevBuf<std::uint8_t> scratch(std::vector<std::uint8_t>(static_cast<std::size_t>(at.bytes), 0));
      g::SdpaBind bd;
      bd.q = q.p + b.q_head_off * dim;
      bd.k = k.p + b.k_head_off * dim;
      bd.v = v.p + b.k_head_off * dim;
      bd.q_off = q_off.p;
      bd.k_off = k_off.p;
      bd.out_q_off = oq.p;
      bd.out_stats_off = os.p;
      bd.out_k_off = ok.p;
      bd.seq_q = sq.p;
      bd.seq_k = sk.p;
      if (pass == g::Pass::fwd) {
        bd.out_o = reinterpret_cast<g::bf16*>(scratch.p + at.o);
        bd.out_stats = reinterpret_cast<float*>(scratch.p + at.stats);
      } else {
        bd.o = o_in.p + b.q_head_off * dim;
        bd.d_o = d_o.p + b.q_head_off * dim;
        bd.stats = stats.p;
        bd.dq = reinterpret_cast<g::bf16*>(scratch.p + at.dq);
        bd.dk = reinterpret_cast<g::bf16*>(scratch.p + at.dk);
        bd.dv = reinterpret_cast<g::bf16*>(scratch.p + at.dv);
      }
      runner.run(runner.prepare(b.geo), bd);
      g::cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      const std::vector<std::uint8_t> dev = scratch.get();
      // The twin on host copies of the same buffers.
      const std::vector<g::bf16> qh = q.get(), kh = k.get(), vh = v.get(), doh = d_o.get();
      std::vector<std::uint8_t> host(static_cast<std::size_t>(at.bytes), 0);
      g::SdpaBind hb = bd;
      hb.q = qh.data() + b.q_head_off * dim;
      hb.k = kh.data() + b.k_head_off * dim;
      hb.v = vh.data() + b.k_head_off * dim;
      hb.q_off = off.q.data();
      hb.k_off = off.k.data();
      hb.out_q_off = off.out_q.data();
      hb.out_stats_off = off.out_stats.data();
      hb.out_k_off = off.out_k.data();
      hb.seq_q = off.seq_q.data();
      hb.seq_k = off.seq_k.data();
      auto bf = [&](std::vector<std::uint8_t>& x, Bytes at_, i64 count) {
        std::vector<g::bf16> out(static_cast<std::size_t>(count));
        std::memcpy(out.data(), x.data() + at_, out.size() * 2);
        return out;
      };
      std::vector<std::uint8_t> devc = dev;
      if (pass == g::Pass::fwd) {
        hb.out_o = reinterpret_cast<g::bf16*>(host.data() + at.o);
        hb.out_stats = reinterpret_cast<float*>(host.data() + at.stats);
        g::sdpa_twin(b.geo, hb);
        const i64 nq = b.total_q * b.geo.q_heads;
        std::vector<float> ls_d(static_cast<std::size_t>(nq)), ls_h(ls_d.size());
        std::memcpy(ls_d.data(), dev.data() + at.stats, ls_d.size() * 4);
        std::memcpy(ls_h.data(), host.data() + at.stats, ls_h.size() * 4);
        const double eo = max_rel_bf16(bf(devc, at.o, nq * dim), bf(host, at.o, nq * dim));
        const double el = max_abs(ls_d, ls_h);
        expect(eo < 2e-2 && el < 1e-2, fmt::format("{} fwd ({}): O {:.2e}, lse {:.2e}", name, g::describe(b.geo), eo, el));
      } else {
        hb.o = o_h.data() + b.q_head_off * dim;
        hb.d_o = doh.data() + b.q_head_off * dim;
        hb.stats = stats_h.data();
        hb.dq = reinterpret_cast<g::bf16*>(host.data() + at.dq);
        hb.dk = reinterpret_cast<g::bf16*>(host.data() + at.dk);
        hb.dv = reinterpret_cast<g::bf16*>(host.data() + at.dv);
        g::sdpa_twin(b.geo, hb);
        const i64 nq = b.total_q * b.geo.q_heads * dim, nk = b.total_k * b.geo.kv_heads * dim;
        const double eq = max_rel_bf16(bf(devc, at.dq, nq), bf(host, at.dq, nq));
        const double ek = max_rel_bf16(bf(devc, at.dk, nk), bf(host, at.dk, nk));
        const double ev = max_rel_bf16(bf(devc, at.dv, nk), bf(host, at.dv, nk));
        expect(eq < 3e-2 && ek < 3e-2 && ev < 3e-2,
               fmt::format("{} bwd ({}): dQ {:.2e}, dK {:.2e}, dV {:.2e}", name, g::describe(b.geo), eq, ek, ev));
      }
    }
  }
  cudaStreamDestroy(stream);
}

// What cuDNN writes for rows without a key: a causal 6 x 2 sequence, unclipped.
void no_key_rows() {
  const int dim = 64;
  g::SdpaBatch b;
  b.geo = {g::Pass::fwd, g::SdpaMask::causal, 0, 1, 2, 2, dim, 64, 64, 2, 2, 0, 0, 0.125f};
  b.seqs = {g::SdpaSeq{0, 6, 10, 2, 0, 0, 0, 0}};
  b.real = 1;
  b.total_q = 6;
  b.total_k = 2;
  std::mt19937_64 rng(1);
  const DevBuf<g::bf16> q(random_bf16(200 * 2 * dim, rng)), k(random_bf16(200 * 2 * dim, rng)),
      v(random_bf16(200 * 2 * dim, rng));
  const g::SdpaOffsets off = g::sdpa_offsets(b);
  const DevBuf<std::int32_t> q_off(off.q), k_off(off.k), oq(off.out_q), os(off.out_stats), ok(off.out_k),
      sq(off.seq_q), sk(off.seq_k);
  const g::SdpaScratch at = g::sdpa_scratch(b);
  std::vector<std::uint8_t> init(static_cast<std::size_t>(at.bytes), 0x7f);  // not zero: shows what is written
  DevBuf<std::uint8_t> scratch(init);
  cudaStream_t stream = nullptr;
  g::cuda::check(cudaStreamCreate(&stream), "cudaStreamCreate");
  g::cudnn::Runner runner(stream);
  g::SdpaBind bd;
  bd.q = q.p;
  bd.k = k.p;
  bd.v = v.p;
  bd.q_off = q_off.p;
  bd.k_off = k_off.p;
  bd.out_q_off = oq.p;
  bd.out_stats_off = os.p;
  bd.out_k_off = ok.p;
  bd.seq_q = sq.p;
  bd.seq_k = sk.p;
  bd.out_o = reinterpret_cast<g::bf16*>(scratch.p + at.o);
  bd.out_stats = reinterpret_cast<float*>(scratch.p + at.stats);
  runner.run(runner.prepare(b.geo), bd);
  g::cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const std::vector<std::uint8_t> out = scratch.get();
  std::string text;
  for (int r = 0; r < 6; ++r) {
    float lse = 0;
    std::memcpy(&lse, out.data() + at.stats + static_cast<std::size_t>(r * 2) * 4, 4);
    g::bf16 o0 = 0;
    std::memcpy(&o0, out.data() + at.o + static_cast<std::size_t>(r * 2 * dim) * 2, 2);
    text += fmt::format(" row {}: lse {} O[0] {};", r, lse, g::bf16_to_float(o0));
  }
  std::printf("info cuDNN on a causal 6 x 2 sequence (rows 0-3 have no key):%s\n", text.c_str());
  cudaStreamDestroy(stream);
}

std::vector<g::RankOutputs> loopback(const test::PlanCase& c, const std::vector<g::RankInputs>& in,
                                     const g::PipelineOptions& opt) {
  const int P = c.plan.sharding.cp_size;
  const g::HeadLayout h = g::HeadLayout::of(*c.problem);
  g::HostWorld world(P);
  std::vector<g::RankOutputs> out(static_cast<std::size_t>(P));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(P));
  std::vector<std::thread> ts;
  for (Rank r = 0; r < P; ++r)
    ts.emplace_back([&, r] {
      try {
        auto be = g::make_cuda_loopback_backend(world, r, 0);
        g::RankPipeline pipe(*be, c.plan.ranks[static_cast<std::size_t>(r)], h, c.plan.sharding.rank_tokens(r).size(),
                             opt);
        pipe.set_inputs(in[static_cast<std::size_t>(r)]);
        for (int it = 0; it < 2; ++it) {
          pipe.forward();
          pipe.backward();
          pipe.synchronize();
        }
        out[static_cast<std::size_t>(r)] = pipe.outputs();
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        world.abort(e.what());
      }
    });
  for (auto& t : ts) t.join();
  g::rethrow_first_cause(errors);
  return out;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) && a[i] == b[i]) continue;
    num = std::max(num, std::abs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::abs(static_cast<double>(b[i])));
  }
  return a.size() != b.size() ? 1e9 : num / (den > 0 ? den : 1);
}

void pipeline_case(int P, int stages, int dim, bool flat, std::uint64_t placement) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(P * 100 + stages * 10 + dim));
  const Token S = 700 * P + static_cast<Token>(rng() % 200);
  auto c = test::make_plan_case(test::random_document_mask(S, rng), P, Heads{16, 4, dim, 2}, GridOptions{flat, 1},
                                stages, placement);
  const std::string name = fmt::format("plan P={} stages={} D={} {}", P, stages, dim, flat ? "flattened" : "grouped");
  std::vector<g::RankInputs> in;
  for (Rank r = 0; r < P; ++r) in.push_back(g::shard_inputs(*c.problem, c.plan.sharding, r, 3));
  g::PipelineOptions cudnn, kernels;
  cudnn.attention = g::AttentionMode::cudnn;
  cudnn.min_band_area = 1;
  cudnn.max_band_graphs = 64;
  kernels.attention = g::AttentionMode::kernels;
  const auto a = loopback(c, in, cudnn), again = loopback(c, in, cudnn), b = loopback(c, in, kernels);
  const g::CheckResult ca = g::check_against_sim(*c.problem, c.plan, a, 3, g::kDefaultTolerance);
  const g::CheckResult cb = g::check_against_sim(*c.problem, c.plan, b, 3, g::kDefaultTolerance);
  expect(ca.passed, name + ", cuDNN: " + ca.text);
  expect(cb.passed, name + ", own kernels: " + cb.text);
  double worst = 0;
  bool same = true;
  for (Rank r = 0; r < P; ++r) {
    const auto& x = a[static_cast<std::size_t>(r)];
    const auto& y = b[static_cast<std::size_t>(r)];
    const auto& z = again[static_cast<std::size_t>(r)];
    for (auto [u, w] : {std::pair{&x.o, &y.o}, std::pair{&x.dq, &y.dq}, std::pair{&x.dk, &y.dk}, std::pair{&x.dv, &y.dv}})
      worst = std::max(worst, max_rel(*u, *w));
    same = same && x.o == z.o && x.lse == z.lse && x.dq == z.dq && x.dk == z.dk && x.dv == z.dv;
  }
  expect(worst < 2e-2, fmt::format("{}: cuDNN path vs own kernels max rel diff {:.2e}", name, worst));
  expect(same, name + ": the cuDNN path gives the same bits twice (deterministic)");
}

void executor_single() {
  auto c = test::make_plan_case(test::generated_mask(MaskKind::causal_document, 4096, {1000, 3096}), 1,
                                Heads{16, 2, 128, 2}, GridOptions{}, 1, 0);
  Params p;
  p.set("launch", std::string("single"));
  p.set("attention", std::string("cudnn"));
  p.set("check", true);
  p.set("iterations", std::int64_t{2});
  g::CudaNcclExecutor ex(p);
  ExecuteInput in;
  in.problem = c.problem;
  in.grid = c.grid;
  in.assignment = &c.assignment;
  in.plan = &c.plan;
  in.seed = 5;
  const ExecutionReport rep = ex.execute(in);
  std::printf("%s", rep.text.c_str());
  expect(rep.passed && rep.figures.get("fwd_cudnn_args").value_or(0) > 0,
         "executor, one rank, attention cudnn, self-check");
}

}  // namespace

int main() {
  if (g::cuda_device_count() == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  if (!g::cudnn::built()) {
    std::printf("cuDNN path %s: skipped\n", g::cudnn::describe_build().c_str());
    return 77;
  }
  std::printf("%s\n", g::cudnn::describe_build().c_str());
  try {
    for (const MaskType t : {MaskType::full, MaskType::causal, MaskType::inv_causal, MaskType::bi_causal})
      for (const int dim : {64, 128}) batch_case(t, dim, dim == 128 ? 1 : -1);
    no_key_rows();
    pipeline_case(1, 1, 128, true, 0);
    pipeline_case(2, 1, 64, true, 5);
    pipeline_case(3, 2, 128, false, 7);
    pipeline_case(4, 2, 128, true, 11);
    executor_single();
  } catch (const std::exception& e) {
    expect(false, std::string("exception: ") + e.what());
  }
  std::printf("%s\n", failures == 0 ? "all cuDNN GPU checks passed" : "cuDNN GPU checks FAILED");
  return failures == 0 ? 0 : 1;
}
