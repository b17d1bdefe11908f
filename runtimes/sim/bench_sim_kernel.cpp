// Throughput of the sim runtime's CPU attention kernel (forward and backward)
// on one arg, for each mask type, single thread and all threads. Figures only:
// the numeric mode's run time on a problem follows from them.
//
//   bench_sim_kernel [--len N] [--heads HQ:HKV] [--dim D] [--threads T]
#include <chrono>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "attention_kernel.hpp"
#include "parallel.hpp"

using namespace cpsched;
using namespace cpsched::sim;

namespace {

std::vector<float> filled(std::size_t n, float seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 2654435761u) % 1000) / 500.0f - 1.0f + seed;
  return v;
}

template <class F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  Token L = 1024;
  int hq = 8, hkv = 2, D = 64, threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--len") L = std::stoll(v);
    else if (k == "--dim") D = std::stoi(v);
    else if (k == "--threads") threads = std::stoi(v);
    else if (k == "--heads") {
      hq = std::stoi(v.substr(0, v.find(':')));
      hkv = std::stoi(v.substr(v.find(':') + 1));
    } else {
      fmt::print(stderr, "bench_sim_kernel: unknown option {}\n", k);
      return 1;
    }
  }
  threads = resolve_threads(threads);
  const KernelShape shape{hq, hkv, D};
  const std::int64_t qw = static_cast<std::int64_t>(hq) * D, kw = static_cast<std::int64_t>(hkv) * D;
  const auto q = filled(static_cast<std::size_t>(L * qw), 0.0f), d_o = filled(q.size(), 0.1f);
  const auto k = filled(static_cast<std::size_t>(L * kw), 0.2f), v = filled(k.size(), 0.3f);
  fmt::print("sim kernel: Lq = Lk = {}, heads {}:{}, D = {}; GFLOP/s counts 4 x area x heads x D (fwd), 2.5x that "
             "(bwd)\n",
             L, hq, hkv, D);
  fmt::print("{:>10} {:>8} {:>12} {:>12}\n", "mask", "threads", "fwd GFLOP/s", "bwd GFLOP/s");
  for (MaskType t : {MaskType::full, MaskType::causal, MaskType::bi_causal}) {
    const Slice arg{{0, L}, {0, L}, t};
    const double flops = 4.0 * attention_work(shape, arg);
    for (int th : {1, threads}) {
      Partial p;
      const double tf = seconds([&] { p = attention_forward(shape, {q.data(), qw}, {k.data(), kw}, {v.data(), kw}, arg, th); });
      std::vector<float> dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(k.size(), 0.0f);
      const BackwardInputs in{{q.data(), qw}, {k.data(), kw}, {v.data(), kw}, p.o_view(), {d_o.data(), qw}, p.lse_view()};
      const double tb = seconds([&] { attention_backward(shape, in, {{dq.data(), qw}, {dk.data(), kw}, {dv.data(), kw}}, arg, th); });
      fmt::print("{:>10} {:>8} {:>12.2f} {:>12.2f}\n", to_string(t), th, flops / tf / 1e9, 2.5 * flops / tb / 1e9);
      if (threads == 1) break;
    }
  }
  return 0;
}
