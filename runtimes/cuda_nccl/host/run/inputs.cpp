#include "inputs.hpp"

#include <algorithm>
#include <fmt/format.h>

#include "cpsched/base/error.hpp"

namespace cpsched::gpu {

namespace {

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Calls f(local_row, global_token) for the rank's rows in buffer order.
template <class F>
void for_rows(const Sharding& sh, Rank r, F&& f) {
  Token local = 0;
  const RangeSet tokens = sh.rank_tokens(r);
  for (const Range& x : tokens.ranges())
    for (Token t = x.begin; t < x.end; ++t) f(local++, t);
}

}  // namespace

float input_value(std::uint64_t seed, InputTensor t, std::uint64_t index) {
  const std::uint64_t bits = mix(mix(seed ^ mix(static_cast<std::uint64_t>(t) * 0x100000001b3ULL)) + index);
  const float u = static_cast<float>(static_cast<double>(bits >> 40) * 0x1.0p-24 * 2.0 - 1.0);
  return bf16_to_float(float_to_bf16(u));
}

// MLA: q [rows x hq x d_qk], dO [rows x hq x d_v], k [rows x hkv x d_qk] (the
// latent when shared), v [rows x hkv x d_v] (empty when shared); element i of
// a token's row of tensor t is input_value(seed, t, token x width(t) + i).
RankInputs shard_inputs(const Problem& p, const Sharding& sh, Rank r, std::uint64_t seed) {
  const Token rows = sh.rank_tokens(r).size();
  const auto hq = static_cast<std::size_t>(p.heads.q), hkv = static_cast<std::size_t>(p.heads.kv);
  const auto wq = hq * static_cast<std::size_t>(p.heads.dqk()), wo = hq * static_cast<std::size_t>(p.heads.dv());
  const auto wk = hkv * static_cast<std::size_t>(p.heads.dqk());
  const auto wv = p.heads.kv_shared ? std::size_t{0} : hkv * static_cast<std::size_t>(p.heads.dv());
  RankInputs in;
  const auto n = static_cast<std::size_t>(rows);
  in.q.resize(n * wq);
  in.d_o.resize(n * wo);
  in.k.resize(n * wk);
  in.v.resize(n * wv);
  for_rows(sh, r, [&](Token l, Token t) {
    const auto lr = static_cast<std::size_t>(l), g = static_cast<std::uint64_t>(t);
    for (std::size_t i = 0; i < wq; ++i) in.q[lr * wq + i] = float_to_bf16(input_value(seed, InputTensor::q, g * wq + i));
    for (std::size_t i = 0; i < wo; ++i)
      in.d_o[lr * wo + i] = float_to_bf16(input_value(seed, InputTensor::d_o, g * wo + i));
    for (std::size_t i = 0; i < wk; ++i) in.k[lr * wk + i] = float_to_bf16(input_value(seed, InputTensor::k, g * wk + i));
    for (std::size_t i = 0; i < wv; ++i) in.v[lr * wv + i] = float_to_bf16(input_value(seed, InputTensor::v, g * wv + i));
  });
  return in;
}

sim::GlobalInputs global_inputs(const Problem& p, std::uint64_t seed) {
  sim::GlobalInputs g;
  g.seqlen = p.seqlen();
  g.hq = p.heads.q;
  g.hkv = p.heads.kv;
  g.dim = p.heads.dqk();
  g.dim_v = p.heads.dv();
  g.kv_shared = p.heads.kv_shared;
  const auto S = static_cast<std::size_t>(g.seqlen);
  g.q.resize(S * static_cast<std::size_t>(g.q_width()));
  g.d_o.resize(S * static_cast<std::size_t>(g.o_width()));
  g.k.resize(S * static_cast<std::size_t>(g.k_width()));
  g.v.resize(S * static_cast<std::size_t>(g.v_width()));
  for (std::size_t i = 0; i < g.q.size(); ++i) g.q[i] = input_value(seed, InputTensor::q, i);
  for (std::size_t i = 0; i < g.d_o.size(); ++i) g.d_o[i] = input_value(seed, InputTensor::d_o, i);
  for (std::size_t i = 0; i < g.k.size(); ++i) g.k[i] = input_value(seed, InputTensor::k, i);
  for (std::size_t i = 0; i < g.v.size(); ++i) g.v[i] = input_value(seed, InputTensor::v, i);
  return g;
}

void place_outputs(const Sharding& sh, Rank r, const HeadLayout& h, const RankOutputs& out, sim::GlobalOutputs& g) {
  const OutputWidths w = output_widths(h);
  const auto rows = static_cast<std::size_t>(sh.rank_tokens(r).size());
  if (out.o.size() != rows * w.o || out.lse.size() != rows * w.lse || out.dq.size() != rows * w.q ||
      out.dk.size() != rows * w.k || out.dv.size() != rows * w.v)
    throw Error(fmt::format("cuda_nccl: outputs of rank {} do not match its {} rows", r, rows));
  auto put = [](const std::vector<float>& src, std::vector<float>& dst, std::size_t lr, std::size_t gt, std::size_t n) {
    if (n > 0)
      std::copy_n(src.begin() + static_cast<std::ptrdiff_t>(lr * n), n, dst.begin() + static_cast<std::ptrdiff_t>(gt * n));
  };
  for_rows(sh, r, [&](Token l, Token t) {
    const auto lr = static_cast<std::size_t>(l), gt = static_cast<std::size_t>(t);
    put(out.o, g.o, lr, gt, w.o);
    put(out.dq, g.dq, lr, gt, w.q);
    put(out.lse, g.lse, lr, gt, w.lse);
    put(out.dk, g.dk, lr, gt, w.k);
    put(out.dv, g.dv, lr, gt, w.v);
  });
}

}  // namespace cpsched::gpu
