// The sim runtime's CPU attention kernel against a naive double reference:
// every mask type, Lq != Lk, empty rows, GQA, strided views, backward, and
// the same bits for any thread count.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "attention_kernel.hpp"
#include "naive_attention.hpp"
#include "row_span.hpp"

using namespace cpsched;
using namespace cpsched::sim;
using cpsched::sim::test::naive_backward;
using cpsched::sim::test::naive_forward;
using cpsched::sim::test::random_floats;
using cpsched::sim::test::rel_err;

namespace {

constexpr MaskType kTypes[] = {MaskType::full, MaskType::causal, MaskType::inv_causal, MaskType::bi_causal};

struct Case {
  Token lq, lk;
  int hq, hkv, dim;
};

// Tensors of a case, stored inside wider buffers (pad rows before the arg and
// pad floats after each row) so that offsets and strides are exercised.
struct Buffers {
  static constexpr Token kRowPad = 3;
  static constexpr std::int64_t kColPad = 5;
  Case c;
  std::vector<float> q, k, v, d_o;  // dense, as the naive reference wants
  std::vector<float> qb, kb, vb;    // padded
  std::int64_t qs, ks;              // strides of the padded buffers

  explicit Buffers(Case cs, std::uint64_t seed) : c(cs) {
    q = random_floats(static_cast<std::size_t>(c.lq * c.hq * c.dim), seed);
    k = random_floats(static_cast<std::size_t>(c.lk * c.hkv * c.dim), seed + 1);
    v = random_floats(static_cast<std::size_t>(c.lk * c.hkv * c.dim), seed + 2);
    d_o = random_floats(static_cast<std::size_t>(c.lq * c.hq * c.dim), seed + 3);
    qs = static_cast<std::int64_t>(c.hq) * c.dim + kColPad;
    ks = static_cast<std::int64_t>(c.hkv) * c.dim + kColPad;
    qb = pad(q, c.lq, static_cast<std::int64_t>(c.hq) * c.dim, qs);
    kb = pad(k, c.lk, static_cast<std::int64_t>(c.hkv) * c.dim, ks);
    vb = pad(v, c.lk, static_cast<std::int64_t>(c.hkv) * c.dim, ks);
  }
  static std::vector<float> pad(const std::vector<float>& x, Token rows, std::int64_t w, std::int64_t stride) {
    std::vector<float> out(static_cast<std::size_t>((rows + kRowPad) * stride), std::nanf(""));
    for (Token r = 0; r < rows; ++r)
      for (std::int64_t i = 0; i < w; ++i)
        out[static_cast<std::size_t>((r + kRowPad) * stride + i)] = x[static_cast<std::size_t>(r * w + i)];
    return out;
  }
  Slice arg(MaskType t) const { return {{kRowPad, kRowPad + c.lq}, {kRowPad, kRowPad + c.lk}, t}; }
  KernelShape shape() const { return {c.hq, c.hkv, c.dim}; }
  CView qv() const { return {qb.data(), qs}; }
  CView kv() const { return {kb.data(), ks}; }
  CView vv() const { return {vb.data(), ks}; }
};

const Case kCases[] = {{1, 1, 1, 1, 4},   {5, 5, 2, 1, 8},    {7, 3, 2, 2, 8},   {3, 9, 4, 2, 8},
                       {70, 130, 4, 2, 16}, {100, 40, 2, 1, 16}, {65, 65, 3, 1, 32}, {33, 97, 1, 1, 24}};

}  // namespace

TEST_CASE("row_span matches slice_contains for every type and shape") {
  for (MaskType t : kTypes)
    for (Token lq = 1; lq <= 9; ++lq)
      for (Token lk = 1; lk <= 9; ++lk)
        for (Token i = 0; i < lq; ++i) {
          const ColSpan s = row_span(t, i, lq, lk);
          for (Token j = 0; j < lk; ++j)
            REQUIRE((j >= s.lo && j < s.hi) == slice_contains(Slice{{0, lq}, {0, lk}, t}, i, j));
        }
}

TEST_CASE("forward equals the naive reference, empty rows give lse -inf and O 0") {
  std::uint64_t seed = 1;
  for (const Case& c : kCases)
    for (MaskType t : kTypes) {
      CAPTURE(c.lq);
      CAPTURE(c.lk);
      CAPTURE(to_string(t));
      const Buffers b(c, seed += 10);
      const Partial p = attention_forward(b.shape(), b.qv(), b.kv(), b.vv(), b.arg(t));
      const auto ref = naive_forward(b.q, b.k, b.v, c.lq, c.lk, c.hq, c.hkv, c.dim, t);
      REQUIRE(p.rows == c.lq);
      CHECK(rel_err(p.o, ref.o) <= 1e-5);
      for (std::size_t n = 0; n < ref.lse.size(); ++n) {
        if (std::isinf(ref.lse[n])) {
          REQUIRE(p.lse[n] == -std::numeric_limits<float>::infinity());
          for (int d = 0; d < c.dim; ++d) REQUIRE(p.o[n * static_cast<std::size_t>(c.dim) + d] == 0.0f);
        } else {
          REQUIRE(std::abs(p.lse[n] - ref.lse[n]) <= 1e-5 * std::max(1.0, std::abs(ref.lse[n])));
        }
      }
    }
}

TEST_CASE("a slice with Lq > Lk has empty top rows (causal) and is empty (bi_causal)") {
  const Buffers b({6, 2, 1, 1, 4}, 99);
  const Partial causal = attention_forward(b.shape(), b.qv(), b.kv(), b.vv(), b.arg(MaskType::causal));
  for (int i = 0; i < 4; ++i) CHECK(causal.lse[static_cast<std::size_t>(i)] == -INFINITY);
  CHECK(std::isfinite(causal.lse[4]));
  const Partial band = attention_forward(b.shape(), b.qv(), b.kv(), b.vv(), b.arg(MaskType::bi_causal));
  for (float l : band.lse) CHECK(l == -INFINITY);
}

TEST_CASE("backward equals the naive reference") {
  std::uint64_t seed = 500;
  for (const Case& c : kCases)
    for (MaskType t : kTypes) {
      CAPTURE(c.lq);
      CAPTURE(c.lk);
      CAPTURE(to_string(t));
      const Buffers b(c, seed += 10);
      const Partial f = attention_forward(b.shape(), b.qv(), b.kv(), b.vv(), b.arg(t));
      // Gradients accumulate: start from ones and subtract them afterwards.
      std::vector<float> dq(b.qb.size(), 1.0f), dk(b.kb.size(), 1.0f), dv(b.vb.size(), 1.0f);
      const std::vector<float> d_o_b = Buffers::pad(b.d_o, c.lq, static_cast<std::int64_t>(c.hq) * c.dim, b.qs);
      // O and lse are given densely (rows from 0): view them from -kRowPad.
      const std::int64_t os = static_cast<std::int64_t>(c.hq) * c.dim;
      BackwardInputs in{b.qv(), b.kv(), b.vv(),
                        CView{f.o.data() - Buffers::kRowPad * os, os},
                        CView{d_o_b.data(), b.qs},
                        CView{f.lse.data() - Buffers::kRowPad * c.hq, c.hq}};
      attention_backward(b.shape(), in, {{dq.data(), b.qs}, {dk.data(), b.ks}, {dv.data(), b.ks}}, b.arg(t));
      const auto ref = naive_backward(b.q, b.k, b.v, b.d_o, c.lq, c.lk, c.hq, c.hkv, c.dim, t);
      auto unpad = [](const std::vector<float>& x, Token rows, std::int64_t w, std::int64_t stride) {
        std::vector<float> out(static_cast<std::size_t>(rows * w));
        for (Token r = 0; r < rows; ++r)
          for (std::int64_t i = 0; i < w; ++i)
            out[static_cast<std::size_t>(r * w + i)] =
                x[static_cast<std::size_t>((r + Buffers::kRowPad) * stride + i)] - 1.0f;
        return out;
      };
      CHECK(rel_err(unpad(dq, c.lq, os, b.qs), ref.dq) <= 1e-4);
      CHECK(rel_err(unpad(dk, c.lk, static_cast<std::int64_t>(c.hkv) * c.dim, b.ks), ref.dk) <= 1e-4);
      CHECK(rel_err(unpad(dv, c.lk, static_cast<std::int64_t>(c.hkv) * c.dim, b.ks), ref.dv) <= 1e-4);
    }
}

TEST_CASE("the naive backward matches finite differences of the naive forward") {
  // Validates the reference the kernel is checked against: L = sum(O * dO).
  const Case c{4, 5, 2, 1, 3};
  for (MaskType t : kTypes) {
    CAPTURE(to_string(t));
    auto q = random_floats(static_cast<std::size_t>(c.lq * c.hq * c.dim), 7);
    auto k = random_floats(static_cast<std::size_t>(c.lk * c.hkv * c.dim), 8);
    auto v = random_floats(static_cast<std::size_t>(c.lk * c.hkv * c.dim), 9);
    const auto d_o = random_floats(q.size(), 10);
    const auto g = naive_backward(q, k, v, d_o, c.lq, c.lk, c.hq, c.hkv, c.dim, t);
    auto loss = [&] {
      const auto f = naive_forward(q, k, v, c.lq, c.lk, c.hq, c.hkv, c.dim, t);
      double l = 0;
      for (std::size_t i = 0; i < f.o.size(); ++i) l += f.o[i] * d_o[i];
      return l;
    };
    auto check = [&](std::vector<float>& x, const std::vector<double>& grad) {
      for (std::size_t i = 0; i < x.size(); ++i) {
        const float keep = x[i];
        const float h = 1e-2f;
        x[i] = keep + h;
        const double up = loss();
        x[i] = keep - h;
        const double down = loss();
        x[i] = keep;
        const double fd = (up - down) / (double(keep + h) - double(keep - h));
        CHECK(std::abs(fd - grad[i]) <= 2e-3);
      }
    };
    check(q, g.dq);
    check(k, g.dk);
    check(v, g.dv);
  }
}

TEST_CASE("results are bitwise the same for any thread count") {
  const Buffers b({300, 280, 4, 2, 64}, 4242);
  for (MaskType t : kTypes) {
    const Partial one = attention_forward(b.shape(), b.qv(), b.kv(), b.vv(), b.arg(t), 1);
    const Partial many = attention_forward(b.shape(), b.qv(), b.kv(), b.vv(), b.arg(t), 7);
    CHECK(one.o == many.o);
    CHECK(one.lse == many.lse);
    const std::vector<float> d_o_b =
        Buffers::pad(b.d_o, b.c.lq, static_cast<std::int64_t>(b.c.hq) * b.c.dim, b.qs);
    const std::int64_t os = static_cast<std::int64_t>(b.c.hq) * b.c.dim;
    BackwardInputs in{b.qv(), b.kv(), b.vv(), CView{one.o.data() - Buffers::kRowPad * os, os},
                      CView{d_o_b.data(), b.qs}, CView{one.lse.data() - Buffers::kRowPad * b.c.hq, b.c.hq}};
    std::vector<std::vector<float>> grads[2];
    for (int run = 0; run < 2; ++run) {
      std::vector<float> dq(b.qb.size(), 0.0f), dk(b.kb.size(), 0.0f), dv(b.vb.size(), 0.0f);
      attention_backward(b.shape(), in, {{dq.data(), b.qs}, {dk.data(), b.ks}, {dv.data(), b.ks}}, b.arg(t),
                         run == 0 ? 1 : 7);
      grads[run] = {dq, dk, dv};
    }
    // NaN pads compare unequal: compare the bits.
    for (int n = 0; n < 3; ++n)
      CHECK(std::memcmp(grads[0][static_cast<std::size_t>(n)].data(), grads[1][static_cast<std::size_t>(n)].data(),
                        grads[0][static_cast<std::size_t>(n)].size() * sizeof(float)) == 0);
  }
}
