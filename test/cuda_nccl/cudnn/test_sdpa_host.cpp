// Range args on cuDNN's fused attention, without a GPU (ctest -L cudnn): the
// route of each arg, the arg -> ragged batch translation, the CPU twin of
// cuDNN's SDPA semantics, and whole plans through the emulate backend (the
// twin in place of cuDNN) against the sim runtime's dense reference.
#include <doctest/doctest.h>

#include <cmath>
#include <mutex>
#include <random>

#include "brute_force.hpp"
#include "cpsched/base/error.hpp"
#include "cpsched/mask/generators.hpp"
#include "host/backend/sdpa_twin.hpp"
#include "host/plan/sdpa_batches.hpp"
#include "host/plan/worklist.hpp"
#include "host/run/check.hpp"
#include "host/run/emulate.hpp"
#include "host/run/inputs.hpp"
#include "host/run/rank_run.hpp"
#include "plans.hpp"

using namespace cpsched;
using cpsched::gpu::i64;
namespace g = cpsched::gpu;

namespace {

AttnArg arg(Token qb, Token qe, Token kb, Token ke, MaskType t, int group = -1, BufferId qbuf = BufferId::local,
            BufferId kbuf = BufferId::local) {
  AttnArg a;
  a.q = {qb, qe};
  a.k = {kb, ke};
  a.type = t;
  a.q_buf = qbuf;
  a.k_buf = kbuf;
  a.group = group;
  return a;
}

PassPlan local_pass(std::vector<AttnArg> args) {
  PassPlan p;
  p.calc.local_attn_args = std::move(args);
  return p;
}

std::vector<g::bf16> random_bf16(std::size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<g::bf16> v(n);
  for (auto& x : v) x = g::float_to_bf16(u(rng));
  return v;
}

float f(g::bf16 x) { return g::bf16_to_float(x); }

// Host buffers of one rank's local shard (tail rows included) for the twin.
struct LocalTensors {
  Token rows;
  g::HeadLayout h;
  std::vector<g::bf16> q, k, v, o, d_o;
  std::vector<float> lse;
  LocalTensors(Token r, g::HeadLayout hl, std::mt19937_64& rng) : rows(r), h(hl) {
    const auto n = static_cast<std::size_t>(r + g::kSdpaTailRows);
    q = random_bf16(n * h.hq * h.dim, rng);
    k = random_bf16(n * h.hkv * h.dim, rng);
    v = random_bf16(n * h.hkv * h.dim, rng);
    o = random_bf16(n * h.hq * h.dim, rng);
    d_o = random_bf16(n * h.hq * h.dim, rng);
    lse.assign(n * h.hq, 0.f);
    std::uniform_real_distribution<float> u(1.f, 3.f);
    for (auto& x : lse) x = u(rng);
  }
};

// Runs one batch through the twin on `t`; returns the packed outputs.
struct TwinOut {
  std::vector<g::bf16> o, dq, dk, dv;
  std::vector<float> stats;
};
TwinOut run_twin(const g::SdpaBatch& b, const LocalTensors& t, const std::vector<float>* stats_in = nullptr) {
  const g::SdpaOffsets off = g::sdpa_offsets(b);
  const int D = t.h.dim;
  TwinOut out;
  out.o.assign(static_cast<std::size_t>(b.total_q * b.geo.q_heads * D), 0);
  out.dq = out.o;
  out.stats.assign(static_cast<std::size_t>(b.total_q * b.geo.q_heads), 0.f);
  out.dk.assign(static_cast<std::size_t>(b.total_k * b.geo.kv_heads * D), 0);
  out.dv = out.dk;
  g::SdpaBind bd;
  bd.q = t.q.data() + b.q_head_off * D;
  bd.k = t.k.data() + b.k_head_off * D;
  bd.v = t.v.data() + b.k_head_off * D;
  bd.o = t.o.data() + b.q_head_off * D;
  bd.d_o = t.d_o.data() + b.q_head_off * D;
  bd.stats = stats_in != nullptr ? stats_in->data() : nullptr;
  bd.out_o = out.o.data();
  bd.out_stats = out.stats.data();
  bd.dq = out.dq.data();
  bd.dk = out.dk.data();
  bd.dv = out.dv.data();
  bd.q_off = off.q.data();
  bd.k_off = off.k.data();
  bd.out_q_off = off.out_q.data();
  bd.out_stats_off = off.out_stats.data();
  bd.out_k_off = off.out_k.data();
  bd.seq_q = off.seq_q.data();
  bd.seq_k = off.seq_k.data();
  g::sdpa_twin(b.geo, bd);
  return out;
}

// Dense attention of one arg (its band, unclipped) for one q head: O, lse of each row with a key.
struct DenseRow {
  bool has_key = false;
  std::vector<double> o;
  double lse = 0;
};
DenseRow dense_row(const AttnArg& a, const LocalTensors& t, Token q, int head) {
  const int D = t.h.dim, kvh = head / (t.h.hq / t.h.hkv);
  const g::Band2 band = g::band_of(a);
  DenseRow r;
  r.o.assign(static_cast<std::size_t>(D), 0.0);
  std::vector<double> s;
  std::vector<Token> keys;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (Token k = a.k.begin; k < a.k.end; ++k) {
    if (!g::band_contains(band, q, k)) continue;
    double dot = 0;
    for (int d = 0; d < D; ++d)
      dot += f(t.q[static_cast<std::size_t>((q * t.h.hq + head) * D + d)]) *
             f(t.k[static_cast<std::size_t>((k * t.h.hkv + kvh) * D + d)]);
    s.push_back(dot * scale);
    keys.push_back(k);
  }
  if (s.empty()) return r;
  r.has_key = true;
  double m = s[0];
  for (double x : s) m = std::max(m, x);
  double l = 0;
  for (std::size_t j = 0; j < s.size(); ++j) {
    const double p = std::exp(s[j] - m);
    l += p;
    for (int d = 0; d < D; ++d)
      r.o[static_cast<std::size_t>(d)] += p * f(t.v[static_cast<std::size_t>((keys[j] * t.h.hkv + kvh) * D + d)]);
  }
  for (double& x : r.o) x /= l;
  r.lse = m + std::log(l);
  return r;
}

g::PipelineOptions every_band() {
  g::PipelineOptions o;
  o.min_band_area = 1;
  o.max_band_graphs = 64;
  return o;
}

std::vector<g::RankInputs> inputs_of(const test::PlanCase& c, std::uint64_t seed) {
  std::vector<g::RankInputs> in;
  for (Rank r = 0; r < c.plan.sharding.cp_size; ++r) in.push_back(g::shard_inputs(*c.problem, c.plan.sharding, r, seed));
  return in;
}

}  // namespace

TEST_CASE("cuDNN's forms of the four mask types, and the heads it takes") {
  const g::SdpaBounds causal = g::sdpa_bounds(g::SdpaMask::causal, 0);
  CHECK((causal.bottom_right && causal.right == 0 && causal.left < 0));
  const g::SdpaBounds inv = g::sdpa_bounds(g::SdpaMask::inv_causal, 0);
  CHECK((!inv.bottom_right && inv.left == 1 && inv.right < 0));
  const g::SdpaBounds bi = g::sdpa_bounds(g::SdpaMask::bi_causal, 7);
  CHECK((!bi.bottom_right && bi.left == 1 && bi.right == 7));
  const g::SdpaBounds full = g::sdpa_bounds(g::SdpaMask::full, 0);
  CHECK((full.left < 0 && full.right < 0));

  CHECK(g::sdpa_heads_reason(128, 128, false, 2).empty());
  CHECK(g::sdpa_heads_reason(64, 64, false, 2).empty());
  CHECK(g::sdpa_heads_reason(576, 512, true, 2).find("MLA") != std::string::npos);
  CHECK(g::sdpa_heads_reason(192, 128, false, 2).find("MLA") != std::string::npos);
  CHECK(g::sdpa_heads_reason(264, 264, false, 2).find("head dim 264") != std::string::npos);
  CHECK(g::sdpa_heads_reason(36, 36, false, 2).find("head dim 36") != std::string::npos);
  CHECK(g::sdpa_heads_reason(128, 128, false, 4).find("4 bytes") != std::string::npos);
}

TEST_CASE("the twin computes every arg's band exactly: each mask type, either side longer, GQA, head groups") {
  std::mt19937_64 rng(5);
  const g::HeadLayout h{4, 2, 16, 2, 2};
  const Token rows = 96;
  const LocalTensors t(rows, h, rng);
  // Rectangles with Lq < Lk, Lq = Lk and Lq > Lk for each type (a causal arg
  // with Lq > Lk and an inv_causal one with Lq > Lk have rows without a key).
  const std::vector<AttnArg> args = {
      arg(0, 20, 5, 40, MaskType::causal),      arg(30, 70, 0, 25, MaskType::causal, 1),
      arg(10, 40, 10, 40, MaskType::causal),    arg(0, 30, 40, 80, MaskType::inv_causal),
      arg(50, 90, 0, 17, MaskType::inv_causal), arg(5, 25, 60, 90, MaskType::bi_causal, 0),
      arg(70, 96, 0, 96, MaskType::full),       arg(20, 33, 44, 51, MaskType::full, 1),
      arg(40, 52, 40, 80, MaskType::bi_causal, 1)};
  g::SdpaPolicy pol;
  pol.min_band_area = 1;
  const g::PassSdpa fwd = g::plan_sdpa(local_pass(args), g::Pass::fwd, h, g::RemoteShape{0, 0, 2, 1}, rows, pol);
  REQUIRE(fwd.kernel_args[0].empty());
  int checked_rows = 0;
  for (const g::SdpaBatch& b : fwd.batches[0]) {
    const TwinOut out = run_twin(b, t);
    for (int si = 0; si < b.real; ++si) {
      const g::SdpaSeq& s = b.seqs[static_cast<std::size_t>(si)];
      const AttnArg& a = args[static_cast<std::size_t>(s.arg)];
      // Every row the arg gives a key is in the sequence, every row of the sequence has one.
      for (Token q = a.q.begin; q < a.q.end; ++q)
        for (int hh = 0; hh < b.geo.q_heads; ++hh) {
          const int head = b.q_head_off + hh;
          const DenseRow ref = dense_row(a, t, q, head);
          const bool inside = q >= s.q_row && q < s.q_row + s.q_len;
          REQUIRE(ref.has_key == inside);
          if (!inside) continue;
          const i64 at = (s.out_q + (q - s.q_row)) * b.geo.q_heads + hh;
          REQUIRE(std::abs(out.stats[static_cast<std::size_t>(at)] - ref.lse) < 1e-4);
          for (int d = 0; d < h.dim; ++d)
            REQUIRE(std::abs(f(out.o[static_cast<std::size_t>(at * h.dim + d)]) - ref.o[static_cast<std::size_t>(d)]) <
                    1e-2);
          ++checked_rows;
        }
    }
  }
  CHECK(checked_rows > 300);
}

TEST_CASE("the twin's backward equals the dense gradients of the band") {
  std::mt19937_64 rng(9);
  const g::HeadLayout h{4, 1, 8, 1, 2};
  const Token rows = 40;
  const LocalTensors t(rows, h, rng);
  for (const MaskType type : {MaskType::causal, MaskType::inv_causal, MaskType::bi_causal, MaskType::full}) {
    const AttnArg a = type == MaskType::bi_causal ? arg(3, 13, 20, 36, type) : arg(3, 21, 8, 20, type);
    g::SdpaPolicy pol;
    pol.min_band_area = 1;
    const g::PassSdpa bwd = g::plan_sdpa(local_pass({a}), g::Pass::bwd, h, g::RemoteShape{0, 0, 4, 1}, rows, pol);
    REQUIRE(bwd.batches[0].size() == 1);
    const g::SdpaBatch& b = bwd.batches[0][0];
    const g::SdpaSeq& s = b.seqs[0];
    // The packed lse the pipeline copies for the batch.
    std::vector<float> stats(static_cast<std::size_t>(b.total_q * h.hq), 0.f);
    for (const g::SdpaSeq& x : b.seqs)
      for (i64 r = 0; r < x.q_len; ++r)
        for (int hh = 0; hh < h.hq; ++hh)
          stats[static_cast<std::size_t>((x.out_q + r) * h.hq + hh)] =
              t.lse[static_cast<std::size_t>((x.q_row + r) * h.hq + hh)];
    const TwinOut out = run_twin(b, t, &stats);
    // Dense: P = exp(scale s - lse), dP = dO . V, dS = P (dP - dO . O).
    const double scale = 1.0 / std::sqrt(8.0);
    const g::Band2 band = g::band_of(a);
    std::vector<double> dq(static_cast<std::size_t>(rows * h.hq * 8), 0.0), dk(static_cast<std::size_t>(rows * 8), 0.0),
        dv(dk.size(), 0.0);
    auto at = [](const std::vector<g::bf16>& x, i64 i) { return static_cast<double>(f(x[static_cast<std::size_t>(i)])); };
    for (Token q = a.q.begin; q < a.q.end; ++q)
      for (int hh = 0; hh < h.hq; ++hh) {
        const i64 qr = (q * h.hq + hh) * 8;
        double delta = 0;
        for (int d = 0; d < 8; ++d) delta += at(t.d_o, qr + d) * at(t.o, qr + d);
        for (Token k = a.k.begin; k < a.k.end; ++k) {
          if (!g::band_contains(band, q, k)) continue;
          double sc = 0, dp = 0;
          for (int d = 0; d < 8; ++d) {
            sc += at(t.q, qr + d) * at(t.k, k * 8 + d);
            dp += at(t.d_o, qr + d) * at(t.v, k * 8 + d);
          }
          const double p = std::exp(sc * scale - t.lse[static_cast<std::size_t>(q * h.hq + hh)]);
          const double ds = p * (dp - delta);
          for (int d = 0; d < 8; ++d) {
            dq[static_cast<std::size_t>(qr + d)] += scale * ds * at(t.k, k * 8 + d);
            dk[static_cast<std::size_t>(k * 8 + d)] += scale * ds * at(t.q, qr + d);
            dv[static_cast<std::size_t>(k * 8 + d)] += p * at(t.d_o, qr + d);
          }
        }
      }
    INFO("type ", to_string(type));
    for (i64 r = 0; r < s.q_len; ++r)
      for (int c = 0; c < h.hq * 8; ++c) {
        const double ref = dq[static_cast<std::size_t>((s.q_row + r) * h.hq * 8 + c)];
        REQUIRE(std::abs(f(out.dq[static_cast<std::size_t>((s.out_q + r) * h.hq * 8 + c)]) - ref) <=
                1e-2 * (1 + std::abs(ref)));
      }
    for (i64 r = 0; r < s.k_len; ++r)
      for (int c = 0; c < 8; ++c) {
        const double rk = dk[static_cast<std::size_t>((s.k_row + r) * 8 + c)];
        const double rv = dv[static_cast<std::size_t>((s.k_row + r) * 8 + c)];
        REQUIRE(std::abs(f(out.dk[static_cast<std::size_t>((s.out_k + r) * 8 + c)]) - rk) <= 1e-2 * (1 + std::abs(rk)));
        REQUIRE(std::abs(f(out.dv[static_cast<std::size_t>((s.out_k + r) * 8 + c)]) - rv) <= 1e-2 * (1 + std::abs(rv)));
      }
  }
}

TEST_CASE("a row no key reaches is never given to cuDNN: the twin poisons such a row, the translation clips it away") {
  std::mt19937_64 rng(3);
  const g::HeadLayout h{2, 2, 8, 1, 2};
  const LocalTensors t(32, h, rng);
  // Unclipped, a causal 6 x 2 rectangle has four rows without keys: the twin writes NaN there.
  g::SdpaBatch raw;
  raw.geo = {g::Pass::fwd, g::SdpaMask::causal, 0, 1, 2, 2, 8, 64, 64, 2, 2, 32 + g::kSdpaTailRows,
             32 + g::kSdpaTailRows, 0.3f};
  raw.seqs = {g::SdpaSeq{0, 6, 10, 2, 0, 0, 0, 0}};
  raw.real = 1;
  raw.total_q = 6;
  raw.total_k = 2;
  const TwinOut poisoned = run_twin(raw, t);
  for (int r = 0; r < 6; ++r) CHECK(std::isnan(poisoned.stats[static_cast<std::size_t>(r * 2)]) == (r < 4));
  // The same arg through the translation: rows 4 and 5 only.
  g::SdpaPolicy pol;
  const g::PassSdpa p =
      g::plan_sdpa(local_pass({arg(0, 6, 10, 12, MaskType::causal)}), g::Pass::fwd, h, g::RemoteShape{}, 32, pol);
  REQUIRE(p.batches[0].size() == 1);
  const g::SdpaSeq& s = p.batches[0][0].seqs[0];
  CHECK((s.q_row == 4 && s.q_len == 2 && s.k_row == 10 && s.k_len == 2));
  const TwinOut clean = run_twin(p.batches[0][0], t);
  for (const float x : clean.stats) CHECK(std::isfinite(x));
  // An inv_causal arg with more rows than cols keeps its first rows.
  const g::PassSdpa inv =
      g::plan_sdpa(local_pass({arg(0, 9, 20, 23, MaskType::inv_causal)}), g::Pass::fwd, h, g::RemoteShape{}, 32, pol);
  const g::SdpaSeq& si = inv.batches[0][0].seqs[0];
  CHECK((si.q_row == 0 && si.q_len == 3 && si.k_len == 3));
  // A bi_causal arg with Lk < Lq has no entries at all: nothing runs.
  const g::PassSdpa none =
      g::plan_sdpa(local_pass({arg(0, 9, 20, 23, MaskType::bi_causal)}), g::Pass::fwd, h, g::RemoteShape{}, 32, pol);
  CHECK(none.batches[0].empty());
  CHECK(none.kernel_args[0].empty());
  CHECK(none.routes.summary.args[static_cast<std::size_t>(g::RouteReason::empty)] == 1);
}

TEST_CASE("routes: index args, the attention mode, a backend without cuDNN, heads, and rare bi_causal diagonals") {
  const g::HeadLayout h{4, 2, 16, 1, 2};
  AttnArg idx = arg(0, 4, 0, 8, MaskType::full);
  idx.index_width = 2;
  idx.index_area = 7;
  std::vector<AttnArg> args = {arg(0, 16, 0, 16, MaskType::causal), idx};
  // Six bi_causal diagonals (band b = 0..5, area rows x (b + 1)), areas falling with the band.
  const Token rows_of[] = {60, 25, 13, 7, 3, 1};
  for (int b = 0; b < 6; ++b)
    args.push_back(arg(100, 100 + rows_of[b], 100, 100 + rows_of[b] + b, MaskType::bi_causal));
  CalcMeta calc;
  calc.local_attn_args = args;
  g::SdpaPolicy pol;
  pol.min_band_area = 1;
  const g::RemoteShape none{0, 0, 4, 2};
  g::PassRoutes r = g::choose_routes(calc, h, pol, none, 200);
  CHECK(r.reason[0][0] == g::RouteReason::cudnn);
  CHECK(r.reason[0][1] == g::RouteReason::index_arg);
  int kept = 0;
  for (int b = 0; b < 6; ++b) kept += r.reason[0][static_cast<std::size_t>(2 + b)] == g::RouteReason::cudnn ? 1 : 0;
  CHECK(kept == pol.max_band_graphs);
  CHECK(r.reason[0][7] == g::RouteReason::rare_band);  // the smallest area
  CHECK(r.summary.cudnn_args() == 1 + pol.max_band_graphs);
  CHECK(r.summary.args[static_cast<std::size_t>(g::RouteReason::index_arg)] == 1);
  CHECK(r.summary.area[static_cast<std::size_t>(g::RouteReason::index_arg)] == 7);
  CHECK(r.summary.text().find("index_arg 1") != std::string::npos);
  // The default minimum area keeps these small diagonals off cuDNN.
  r = g::choose_routes(calc, h, g::SdpaPolicy{}, none, 200);
  CHECK(r.reason[0][2] == g::RouteReason::rare_band);
  pol.mode = g::AttentionMode::kernels;
  r = g::choose_routes(calc, h, pol, none, 200);
  CHECK(r.reason[0][0] == g::RouteReason::mode);
  CHECK(r.summary.cudnn_args() == 0);
  pol.mode = g::AttentionMode::automatic;
  pol.backend_lacks = "no device";
  CHECK(g::choose_routes(calc, h, pol, none, 200).reason[0][0] == g::RouteReason::no_cudnn);
  pol.backend_lacks.clear();
  CHECK(g::choose_routes(calc, g::HeadLayout{4, 2, 12, 1, 2}, pol, none, 200).reason[0][0] == g::RouteReason::heads);
  CHECK(g::choose_routes(calc, g::HeadLayout{4, 2, 320, 1, 2}, pol, none, 200).reason[0][0] == g::RouteReason::heads);
  // MLA (apart or a shared latent): range args run as index rows on the index kernels, whatever the mode; index
  // args stay index args.
  for (const bool shared : {false, true}) {
    const g::HeadLayout mla{4, shared ? 1 : 2, 576, 1, 2, 512, shared};
    for (const auto mode : {g::AttentionMode::automatic, g::AttentionMode::kernels}) {
      pol.mode = mode;
      r = g::choose_routes(calc, mla, pol, none, 200);
      CHECK(r.reason[0][0] == g::RouteReason::index_rows);
      CHECK(r.reason[0][1] == g::RouteReason::index_arg);
      CHECK(r.summary.args[static_cast<std::size_t>(g::RouteReason::index_rows)] == 7);
      CHECK(r.summary.cudnn_args() == 0);
      CHECK(r.summary.text().find("index_rows 7") != std::string::npos);
    }
  }
  pol.mode = g::AttentionMode::automatic;
  // 32-bit offsets: a local buffer of 2^31 / (hq * d) rows or more stays on the kernels.
  CHECK(g::choose_routes(calc, h, pol, none, (Token{1} << 31) / 64).reason[0][0] == g::RouteReason::offsets);
  // An arg outside its buffer is an error naming it.
  calc.local_attn_args.push_back(arg(190, 210, 0, 4, MaskType::full));
  CHECK_THROWS_WITH_AS(g::choose_routes(calc, h, pol, none, 200), doctest::Contains("stage 0 attention arg 8 has q [190, 210)"),
                       Error);
}

TEST_CASE("batches: grouped by buffers, group and form; backward q rows disjoint; bucketed with tail-row dummies") {
  const g::HeadLayout h{8, 4, 32, 2, 2};
  PassPlan p;
  p.calc.local_attn_args = {arg(0, 10, 0, 10, MaskType::causal, 0), arg(0, 10, 20, 30, MaskType::causal, 0),
                            arg(5, 9, 0, 40, MaskType::full, 1), arg(40, 50, 40, 50, MaskType::causal, 0)};
  p.calc.remote_attn_args = {{arg(0, 8, 0, 8, MaskType::full, 1, BufferId::remote, BufferId::local),
                              arg(0, 3, 0, 5, MaskType::full, 1, BufferId::local, BufferId::remote)}};
  const g::RemoteShape shape{20, 30, 4, 2};
  const g::PassSdpa fwd = g::plan_sdpa(p, g::Pass::fwd, h, shape, 64, g::SdpaPolicy{});
  REQUIRE(fwd.batches[0].size() == 2);  // (local, local, 0, causal), (local, local, 1, full)
  const g::SdpaBatch& c = fwd.batches[0][0];
  CHECK(c.real == 3);
  CHECK(c.geo.batch == 4);  // bucketed
  CHECK(c.seqs[3].arg == -1);
  CHECK((c.seqs[3].q_row == 64 && c.seqs[3].q_len == 1 && c.seqs[3].k_row == 64));  // the first tail row
  CHECK((c.geo.max_q == 64 && c.geo.max_k == 64));
  CHECK((c.geo.q_heads == 4 && c.geo.kv_heads == 2 && c.geo.q_row_heads == 8 && c.geo.k_row_heads == 4));
  CHECK((c.q_head_off == 0 && c.k_head_off == 0));
  CHECK((fwd.batches[0][1].q_head_off == 4 && fwd.batches[0][1].k_head_off == 2));
  CHECK(c.total_q == 10 + 10 + 10 + 1);
  REQUIRE(fwd.batches[1].size() == 2);
  const g::SdpaBatch& rq = fwd.batches[1][0];
  CHECK((rq.q_buf == BufferId::remote && rq.q_head_off == 0 && rq.geo.q_row_heads == 4 && rq.q_rows == 20));
  CHECK((fwd.batches[1][1].k_buf == BufferId::remote && fwd.batches[1][1].k_rows == 30));
  CHECK(fwd.batches[1][1].geo.k_capacity == 0);  // forward graphs do not depend on it
  // Offsets: elements from the batch's base pointers; the last entry ends the rows.
  const g::SdpaOffsets off = g::sdpa_offsets(c);
  CHECK(off.q == std::vector<std::int32_t>{0, 0, 40 * 8 * 32, 64 * 8 * 32, 65 * 8 * 32});
  CHECK(off.k[1] == 20 * 4 * 32);
  CHECK(off.out_q == std::vector<std::int32_t>{0, 10 * 4 * 32, 20 * 4 * 32, 30 * 4 * 32, 31 * 4 * 32});
  CHECK(off.out_stats[2] == 20 * 4);
  CHECK(off.seq_q == std::vector<std::int32_t>{10, 10, 10, 1});
  // Backward: the two causal args on q rows [0, 10) go to two batches.
  const g::PassSdpa bwd = g::plan_sdpa(p, g::Pass::bwd, h, shape, 64, g::SdpaPolicy{});
  REQUIRE(bwd.batches[0].size() == 3);
  CHECK((bwd.batches[0][0].geo.q_capacity == 64 + 128 && bwd.batches[0][0].geo.k_capacity == 64 + 128));
  CHECK(bwd.batches[0][0].real == 2);  // args 0 and 3
  CHECK(bwd.batches[0][1].real == 1);  // arg 1
  CHECK(bwd.batches[0][1].seqs[0].arg == 1);
  // Scratch: fwd O then lse; bwd dQ, dK, dV, lse; 16-byte aligned.
  const g::SdpaScratch sf = g::sdpa_scratch(c);
  CHECK((sf.o == 0 && sf.stats == 31 * 4 * 32 * 2 && sf.bytes == sf.stats + 31 * 4 * 4));
  const g::SdpaScratch sb = g::sdpa_scratch(bwd.batches[0][0]);
  CHECK((sb.dk % 16 == 0 && sb.dv > sb.dk && sb.stats > sb.dv && sb.bytes > sb.stats));
}

TEST_CASE("launch layers keep each merge launch's targets disjoint") {
  const std::vector<g::Footprint> f = {{0, 10, 0, 4}, {5, 15, 0, 4}, {10, 20, 0, 4}, {5, 15, 4, 8}, {0, 30, 2, 3}};
  const std::vector<int> l = g::disjoint_layers(f);
  CHECK(l == std::vector<int>{0, 1, 0, 0, 2});
}

TEST_CASE("whole plans through the emulated cuDNN path match the sim runtime: masks, ranks, stages, head groups") {
  std::mt19937_64 rng(77);
  struct Case {
    int P, stages, dim;
    bool flat;
    std::uint64_t placement;
    int mask;  // 0 random documents (all four types), 1 causal documents, 2 sliding window
  };
  const Case cases[] = {{1, 1, 16, true, 0, 0}, {2, 1, 32, true, 3, 1}, {3, 2, 16, true, 9, 0},
                        {4, 2, 16, false, 4, 2}, {4, 3, 16, true, 0, 0}, {3, 1, 64, true, 2, 1},
                        {2, 2, 16, false, 5, 0}};
  for (const Case& k : cases) {
    const Token S = 96 * k.P + static_cast<Token>(rng() % 64);
    RangeMask mask = k.mask == 0   ? test::random_document_mask(S, rng)
                     : k.mask == 1 ? test::generated_mask(MaskKind::causal_document, S, {S / 2, S / 3, S - S / 2 - S / 3})
                                   : [&] {
                                       MaskSpec spec;
                                       spec.kind = MaskKind::sliding_window;
                                       spec.window_left = 37;
                                       spec.lengths = {S / 3, S - S / 3};
                                       return make_mask(spec, S);
                                     }();
    auto c = test::make_plan_case(mask, k.P, Heads{4, 2, k.dim, 2}, GridOptions{k.flat, 1 + k.P % 2}, k.stages,
                                  k.placement);
    const g::HeadLayout hl = g::HeadLayout::of(*c.problem);
    const g::EmulatedRun run = g::emulate(c.plan, hl, inputs_of(c, 7), g::Schedule::eager, every_band());
    const g::CheckResult res = g::check_against_sim(*c.problem, c.plan, run.outputs, 7, g::kDefaultTolerance, 2);
    INFO("P=", k.P, " stages=", k.stages, " D=", k.dim, " flat=", k.flat, " mask=", k.mask, ": ", res.text, "; fwd ",
         run.routes[0].text(), "; bwd ", run.routes[1].text());
    CHECK(res.passed);
    CHECK(res.errors.max() < 5e-3);
    CHECK(run.routes[0].cudnn_args() > 0);
    CHECK(run.routes[0].kernel_args() == 0);
    CHECK(run.routes[1].kernel_args() == 0);
  }
}

TEST_CASE("the cuDNN path and the runtime's kernels agree, and either stream's delay changes nothing") {
  std::mt19937_64 rng(17);
  auto c = test::make_plan_case(test::random_document_mask(400, rng), 4, Heads{4, 2, 16, 2}, GridOptions{true, 1}, 2, 21);
  const g::HeadLayout hl = g::HeadLayout::of(*c.problem);
  const auto in = inputs_of(c, 3);
  g::PipelineOptions kernels;
  kernels.attention = g::AttentionMode::kernels;
  const g::EmulatedRun own = g::emulate(c.plan, hl, in, g::Schedule::eager, kernels);
  CHECK(own.routes[0].cudnn_args() == 0);
  const g::EmulatedRun eager = g::emulate(c.plan, hl, in, g::Schedule::eager, every_band());
  const g::EmulatedRun lazy_comm = g::emulate(c.plan, hl, in, g::Schedule::lazy_comm, every_band());
  const g::EmulatedRun lazy_compute = g::emulate(c.plan, hl, in, g::Schedule::lazy_compute, every_band());
  double worst = 0, scale = 0;
  for (std::size_t r = 0; r < eager.outputs.size(); ++r) {
    // Deterministic: the same plan gives the same bits, whatever the schedule.
    CHECK(eager.outputs[r].o == lazy_comm.outputs[r].o);
    CHECK(eager.outputs[r].dk == lazy_comm.outputs[r].dk);
    CHECK(eager.outputs[r].dq == lazy_compute.outputs[r].dq);
    CHECK(eager.outputs[r].lse == lazy_compute.outputs[r].lse);
    const std::vector<float>* a[] = {&eager.outputs[r].o, &eager.outputs[r].dq, &eager.outputs[r].dk,
                                     &eager.outputs[r].dv};
    const std::vector<float>* b[] = {&own.outputs[r].o, &own.outputs[r].dq, &own.outputs[r].dk, &own.outputs[r].dv};
    for (int t = 0; t < 4; ++t)
      for (std::size_t i = 0; i < a[t]->size(); ++i) {
        worst = std::max(worst, static_cast<double>(std::abs((*a[t])[i] - (*b[t])[i])));
        scale = std::max(scale, static_cast<double>(std::abs((*b[t])[i])));
      }
  }
  INFO("worst |cuDNN path - kernels| = ", worst, " of ", scale);
  CHECK(worst <= 8e-3 * scale);  // two bf16 roundings: the packed outputs and the wire
}

TEST_CASE("the executor's attention parameter and report") {
  std::mt19937_64 rng(29);
  auto c = test::make_plan_case(test::random_document_mask(320, rng), 3, Heads{4, 2, 16, 2}, GridOptions{true, 1}, 2, 6);
  for (const char* mode : {"auto", "kernels"}) {
    Params p;
    p.set("backend", std::string("emulate"));
    p.set("check", true);
    p.set("attention", std::string(mode));
    p.set("iterations", std::int64_t{1});
    p.set("threads", std::int64_t{2});
    const ExecutionReport rep = g::run_emulated(*c.problem, c.plan, g::parse_run_options(p), 11);
    INFO(rep.text);
    CHECK(rep.passed);
    CHECK(rep.text.find(std::string("attention ") + mode) != std::string::npos);
    CHECK(rep.text.find("attention (all ranks), forward: cuDNN") != std::string::npos);
    const double cudnn_args = rep.figures.get("fwd_cudnn_args").value_or(-1);
    if (std::string(mode) == "kernels") CHECK(cudnn_args == 0);
    else CHECK(cudnn_args > 0);
  }
  Params bad;
  bad.set("attention", std::string("flash"));
  CHECK_THROWS_WITH_AS(g::parse_run_options(bad), doctest::Contains("attention = 'flash' is not one of auto, cudnn, kernels"),
                       Error);
}

namespace {

// A backend whose cuDNN cannot build causal graphs.
class NoCausalBackend final : public g::HostBackend {
 public:
  using g::HostBackend::HostBackend;
  int sdpa_prepare(const g::SdpaGeometry& geo) override {
    if (geo.mask == g::SdpaMask::causal) throw Error("cuDNN (test): no engine for " + g::describe(geo));
    return g::HostBackend::sdpa_prepare(geo);
  }
};

}  // namespace

TEST_CASE("a graph cuDNN cannot build sends its batch's args to the kernels (auto), or fails the run (cudnn)") {
  std::mt19937_64 rng(61);
  auto c = test::make_plan_case(test::random_document_mask(360, rng), 3, Heads{4, 2, 16, 2}, GridOptions{true, 1}, 2, 4);
  const g::HeadLayout hl = g::HeadLayout::of(*c.problem);
  const auto in = inputs_of(c, 5);
  for (const g::AttentionMode mode : {g::AttentionMode::automatic, g::AttentionMode::cudnn}) {
    g::PipelineOptions opt = every_band();
    opt.attention = mode;
    g::HostWorld world(3);
    std::vector<g::RankOutputs> out(3);
    g::RouteSummary fwd;
    std::size_t failures = 0;
    std::mutex mu;
    auto run = [&] {
      g::run_rank_threads(world, 3, [&](Rank r) {
        NoCausalBackend be(world, r);
        g::RankPipeline pipe(be, c.plan.ranks[static_cast<std::size_t>(r)], hl,
                             c.plan.sharding.rank_tokens(r).size(), opt);
        pipe.set_inputs(in[static_cast<std::size_t>(r)]);
        pipe.forward();
        pipe.backward();
        pipe.synchronize();
        out[static_cast<std::size_t>(r)] = pipe.outputs();
        std::lock_guard lock(mu);
        fwd.add(pipe.sdpa(g::Pass::fwd).routes.summary);
        failures += pipe.sdpa_failures().size();
      });
    };
    if (mode == g::AttentionMode::cudnn) {
      CHECK_THROWS_WITH_AS(run(), doctest::Contains("no engine for fwd causal"), Error);
      continue;
    }
    run();
    const g::CheckResult res = g::check_against_sim(*c.problem, c.plan, out, 5, g::kDefaultTolerance, 2);
    INFO(res.text, "; ", fwd.text());
    CHECK(res.passed);
    CHECK(failures > 0);
    CHECK(fwd.args[static_cast<std::size_t>(g::RouteReason::graph)] > 0);
    CHECK(fwd.cudnn_args() > 0);  // the other forms stay on cuDNN
  }
}
