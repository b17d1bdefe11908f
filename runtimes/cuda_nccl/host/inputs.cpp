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

RankInputs shard_inputs(const Problem& p, const Sharding& sh, Rank r, std::uint64_t seed) {
  const Token rows = sh.rank_tokens(r).size();
  const auto wq = static_cast<std::size_t>(p.heads.q) * static_cast<std::size_t>(p.heads.dim);
  const auto wk = static_cast<std::size_t>(p.heads.kv) * static_cast<std::size_t>(p.heads.dim);
  RankInputs in;
  in.q.resize(static_cast<std::size_t>(rows) * wq);
  in.d_o.resize(in.q.size());
  in.k.resize(static_cast<std::size_t>(rows) * wk);
  in.v.resize(in.k.size());
  for_rows(sh, r, [&](Token l, Token t) {
    const auto lr = static_cast<std::size_t>(l), g = static_cast<std::uint64_t>(t);
    for (std::size_t i = 0; i < wq; ++i) {
      in.q[lr * wq + i] = float_to_bf16(input_value(seed, InputTensor::q, g * wq + i));
      in.d_o[lr * wq + i] = float_to_bf16(input_value(seed, InputTensor::d_o, g * wq + i));
    }
    for (std::size_t i = 0; i < wk; ++i) {
      in.k[lr * wk + i] = float_to_bf16(input_value(seed, InputTensor::k, g * wk + i));
      in.v[lr * wk + i] = float_to_bf16(input_value(seed, InputTensor::v, g * wk + i));
    }
  });
  return in;
}

sim::GlobalInputs global_inputs(const Problem& p, std::uint64_t seed) {
  sim::GlobalInputs g;
  g.seqlen = p.seqlen();
  g.hq = p.heads.q;
  g.hkv = p.heads.kv;
  g.dim = p.heads.dim;
  g.dim_v = p.heads.dim;  // GQA only (HeadLayout refuses MLA); the sim's dense reference reads dim_v
  const auto nq = static_cast<std::size_t>(g.seqlen) * static_cast<std::size_t>(g.hq) * static_cast<std::size_t>(g.dim);
  const auto nk = static_cast<std::size_t>(g.seqlen) * static_cast<std::size_t>(g.hkv) * static_cast<std::size_t>(g.dim);
  g.q.resize(nq);
  g.d_o.resize(nq);
  g.k.resize(nk);
  g.v.resize(nk);
  for (std::size_t i = 0; i < nq; ++i) {
    g.q[i] = input_value(seed, InputTensor::q, i);
    g.d_o[i] = input_value(seed, InputTensor::d_o, i);
  }
  for (std::size_t i = 0; i < nk; ++i) {
    g.k[i] = input_value(seed, InputTensor::k, i);
    g.v[i] = input_value(seed, InputTensor::v, i);
  }
  return g;
}

void place_outputs(const Sharding& sh, Rank r, const HeadLayout& h, const RankOutputs& out, sim::GlobalOutputs& g) {
  const auto wq = static_cast<std::size_t>(h.hq) * static_cast<std::size_t>(h.dim);
  const auto wk = static_cast<std::size_t>(h.hkv) * static_cast<std::size_t>(h.dim);
  const auto hq = static_cast<std::size_t>(h.hq);
  const auto rows = static_cast<std::size_t>(sh.rank_tokens(r).size());
  if (out.o.size() != rows * wq || out.lse.size() != rows * hq || out.dq.size() != rows * wq ||
      out.dk.size() != rows * wk || out.dv.size() != rows * wk)
    throw Error(fmt::format("cuda_nccl: outputs of rank {} do not match its {} rows", r, rows));
  for_rows(sh, r, [&](Token l, Token t) {
    const auto lr = static_cast<std::size_t>(l), gt = static_cast<std::size_t>(t);
    std::copy_n(out.o.begin() + static_cast<std::ptrdiff_t>(lr * wq), wq, g.o.begin() + static_cast<std::ptrdiff_t>(gt * wq));
    std::copy_n(out.dq.begin() + static_cast<std::ptrdiff_t>(lr * wq), wq, g.dq.begin() + static_cast<std::ptrdiff_t>(gt * wq));
    std::copy_n(out.lse.begin() + static_cast<std::ptrdiff_t>(lr * hq), hq, g.lse.begin() + static_cast<std::ptrdiff_t>(gt * hq));
    std::copy_n(out.dk.begin() + static_cast<std::ptrdiff_t>(lr * wk), wk, g.dk.begin() + static_cast<std::ptrdiff_t>(gt * wk));
    std::copy_n(out.dv.begin() + static_cast<std::ptrdiff_t>(lr * wk), wk, g.dv.begin() + static_cast<std::ptrdiff_t>(gt * wk));
  });
}

}  // namespace cpsched::gpu
