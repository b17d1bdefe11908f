#include "global_tensors.hpp"

namespace cpsched::sim {

namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::vector<float> uniform(std::size_t n, std::uint64_t seed, std::uint64_t tensor) {
  std::vector<float> out(n);
  const std::uint64_t base = splitmix64(seed ^ splitmix64(tensor));
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t bits = splitmix64(base + i);
    out[i] = static_cast<float>(static_cast<double>(bits >> 40) * 0x1.0p-24 * 2.0 - 1.0);
  }
  return out;
}

}  // namespace

GlobalInputs GlobalInputs::generate(const Problem& p, std::uint64_t seed) {
  GlobalInputs g;
  g.seqlen = p.seqlen();
  g.hq = p.heads.q;
  g.hkv = p.heads.kv;
  g.dim = p.heads.dqk();
  g.dim_v = p.heads.dv();
  g.kv_shared = p.heads.kv_shared;
  const auto S = static_cast<std::size_t>(g.seqlen);
  g.q = uniform(S * static_cast<std::size_t>(g.q_width()), seed, 1);
  g.k = uniform(S * static_cast<std::size_t>(g.k_width()), seed, 2);
  g.v = uniform(S * static_cast<std::size_t>(g.v_width()), seed, 3);
  g.d_o = uniform(S * static_cast<std::size_t>(g.o_width()), seed, 4);
  return g;
}

GlobalOutputs GlobalOutputs::like(const GlobalInputs& in, float fill, float lse_fill) {
  GlobalOutputs o;
  const auto S = static_cast<std::size_t>(in.seqlen);
  o.o.assign(S * static_cast<std::size_t>(in.o_width()), fill);
  o.dq.assign(S * static_cast<std::size_t>(in.q_width()), fill);
  o.dk.assign(S * static_cast<std::size_t>(in.k_width()), fill);
  o.dv.assign(S * static_cast<std::size_t>(in.v_width()), fill);
  o.lse.assign(static_cast<std::size_t>(in.seqlen) * static_cast<std::size_t>(in.hq), lse_fill);
  return o;
}

double numeric_bytes_estimate(const Problem& p) {
  const double S = static_cast<double>(p.seqlen());
  const double q = S * p.heads.q * p.heads.dqk(), o = S * p.heads.q * p.heads.dv();
  const double kv = S * p.heads.kv * (p.heads.dqk() + (p.heads.kv_shared ? 0 : p.heads.dv()));
  // inputs (Q, dO, K, V), reference and gathered outputs, rank copies of
  // inputs and outputs, remote buffers (at most a few times the local ones).
  const double per_copy = (q + o) + kv + o + kv + S * p.heads.q;  // = 3q + 4 S hkv D under GQA, as before
  return 4.0 * per_copy * 6.0;
}

}  // namespace cpsched::sim
