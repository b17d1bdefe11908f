#pragma once
// Index args (token top-k) on tensor cores: forward, dQ and dK / dV as CTA
// programs for the GPU and their CPU twin (the Exec contract of
// attention_programs.hpp, plus ex.warps(f): f(w) once per warp w, the warp's
// 32 threads together on the GPU, one call on the CPU). Matrix products are
// warp_mma's 16 x 16 tiles (tile_mma.hpp: WMMA bf16, fp32 accumulation on
// the GPU, a scalar product on the CPU); everything else is shared code.
//
// Forward and dQ (q-major, index_worklist.hpp): a CTA takes one q-buffer row
// and one kv head. The row's query heads that share the kv head are the MMA
// rows (16 x MT of them; a kv head with more query heads takes several
// blocks, grid y), and the row's selected keys are gathered 64 at a time
// from its index list into shared memory: S = Q K^T and O += P V (forward,
// online softmax in fp32, P rounded to bf16 for the product), or S, dP =
// dO V^T and dQ += dS K (dQ). Each key row is read once per (row, kv head)
// CTA for all its query heads.
//
// dK, dV (k-major): a CTA takes 16 consecutive cols of the k buffer and one
// kv head; the MMA rows are those 16 keys, the MMA cols the (q row, head)
// pairs of the rows selecting any of them (the host's union list), 64 at a
// time: S^T = K Q^T, dP^T = V dO^T, then dV += P^T dO and dK += dS^T Q, a
// pair's mask bit zeroing the keys its row did not select. Every result is
// written once by one CTA, in a fixed order: deterministic, no atomics.
//
// Head dims: DQ for Q and K (the S products, dQ, dK), DV for V, O and dO (the
// PV and dP products, dV). MLA's shared latent (kLatent, the launch's
// `latent`; KSide::v == k): V is the
// first DV columns of the K rows already gathered, so a key's latent row is
// read once per CTA for both products, and dV is added into the latent's
// gradient after dK (one barrier apart: different threads own them).
#include "attention_programs.hpp"
#include "tile_mma.hpp"

namespace cpsched::gpu {

inline constexpr int kIndexThreads = 128;  // 4 warps
inline constexpr int kIndexWarps = kIndexThreads / 32;
inline constexpr int kIndexKeys = 64;      // keys (q-major) or pairs (k-major) per step

struct IndexNoState {};

CPSCHED_HD inline void copy16(bf16* dst, const bf16* src) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
#else
  std::memcpy(dst, src, 16);
#endif
}

CPSCHED_HD inline void zero16(bf16* dst) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
#else
  std::memset(dst, 0, 16);
#endif
}

// Heads of kv slot `slot` for an item of head group `group`: the first query
// head of the kv head inside a row of the q buffer, and the kv head inside a
// row of the k buffer. `major_buf` is the buffer the launch tiles (q-major:
// the q buffer; k-major: the k buffer); false when the slot's kv head is not
// in the item's group.
struct IndexHeads {
  int q_head;
  int k_head;
};

CPSCHED_HD inline bool index_heads(const IndexLaunch& p, int q_buf, int k_buf, int major_buf, int group, int slot,
                                   IndexHeads& out) {
  const int hq_g = p.hq / p.groups, hkv_g = p.hkv / p.groups, ratio = p.hq / p.hkv;
  int g, kvh;
  if (major_buf == 0) {
    kvh = slot;
    g = kvh / hkv_g;
    if (group >= 0 && group != g) return false;
  } else {
    g = group < 0 ? 0 : group;
    kvh = g * hkv_g + slot;
  }
  out.q_head = q_buf == 0 ? kvh * ratio : kvh * ratio - g * hq_g;
  out.k_head = k_buf == 0 ? kvh : kvh - g * hkv_g;
  return true;
}

// 16-head MMA tiles per block of a q-major launch: one up to 16 query heads
// per kv head, else 4 (64 heads), or 2 (32 heads) when the head dim is over
// 256 (MLA's 576: a block's Q, its gathered latent rows and its fp32 O
// accumulator must fit sm_90's 227 KiB of shared memory).
CPSCHED_HD constexpr int index_mt(int ratio, int dim) { return ratio <= 16 ? 1 : dim > 256 ? 2 : 4; }
// Query heads per block of a q-major launch.
CPSCHED_HD constexpr int index_block_heads(int ratio, int dim) { return 16 * index_mt(ratio, dim); }
// Keys (dQ: q-major) or (row, head) pairs (dK / dV: k-major) per step: halved
// over 256 dims, for the same reason.
CPSCHED_HD constexpr int index_step(int dim) { return dim > 256 ? kIndexKeys / 2 : kIndexKeys; }

// ---------------------------------------------------------------- forward
// kLatent: MLA's shared latent (IndexLaunch::latent): V is K's first DV columns, no V tile.
template <int DQ, int DV, int MT, bool kLatent = false>
struct IndexFwdProgram {
  static_assert(DQ % 16 == 0 && DV % 16 == 0, "index programs: head dims multiple of 16");
  static constexpr int kThreads = kIndexThreads;
  static constexpr int kM = 16 * MT, kN = kIndexKeys;
  static constexpr int kLdq = DQ + 8, kLdv = DV + 8, kLdo = DV + 4, kLds = kN + 4, kLdp = kN + 8;
  static constexpr int kTpr = kThreads / kM, kCpt = kN / kTpr;  // softmax: threads per row, cols per thread
  using State = IndexNoState;
  struct Smem {
    alignas(32) bf16 q[kM][kLdq];
    alignas(32) bf16 k[kN][kLdq];
    alignas(32) bf16 v[kLatent ? 1 : kN][kLdv];  // none with a shared latent
    alignas(32) float s[kM][kLds];
    alignas(32) bf16 p[kM][kLdp];
    alignas(32) float o[kM][kLdo];
    float m[kM], l[kM], mnew[kM], corr[kM];
    float part[kM][kTpr];
    std::int32_t key[kN];
  };
  IndexLaunch p;

  template <class Exec>
  CPSCHED_HD void operator()(Exec& ex, int bx, int by, Smem& sm) const {
    const QSide& qs = p.q[p.major_buf];
    const i64 row = p.major[bx];
    const int slot = by % p.slots, h_lo = (by / p.slots) * kM;
    const int nh = hd_min(kM, p.hq / p.hkv - h_lo);
    ex.each([&](int t, State&) {
      for (int r = t; r < kM; r += kThreads) {
        sm.m[r] = neg_inf();
        sm.l[r] = 0.f;
      }
      for (int i = t; i < kM * kLdo; i += kThreads) (&sm.o[0][0])[i] = 0.f;
    });
    int q_head = -1;
    for (int e = p.begin[bx]; e < p.begin[bx + 1]; ++e) {
      const IndexQItem it = p.q_items[e];
      IndexHeads hm;
      if (!index_heads(p, p.major_buf, it.other_buf, p.major_buf, it.group, slot, hm)) continue;
      if (q_head < 0) {  // the row's query heads, once
        q_head = hm.q_head + h_lo;
        ex.each([&](int t, State&) {
          for (int u = t; u < kM * (DQ / 8); u += kThreads) {
            const int r = u / (DQ / 8), c = (u % (DQ / 8)) * 8;
            if (r < nh) copy16(&sm.q[r][c], qs.q + (row * qs.heads + q_head + r) * DQ + c);
            else zero16(&sm.q[r][c]);
          }
        });
      }
      const KSide& ks = p.k[it.other_buf];
      const std::int32_t* keys = p.indices + it.keys;
      for (int j0 = 0; j0 < it.width; j0 += kN) {
        ex.sync();
        ex.each([&](int t, State&) {
          for (int j = t; j < kN; j += kThreads) sm.key[j] = j0 + j < it.width ? keys[j0 + j] : -1;
        });
        ex.sync();
        ex.each([&](int t, State&) {  // gather the chunk's K (the latent) and V rows
          for (int u = t; u < kN * (DQ / 8); u += kThreads) {
            const int j = u / (DQ / 8), c = (u % (DQ / 8)) * 8;
            const std::int32_t key = sm.key[j];
            if (key >= 0) copy16(&sm.k[j][c], ks.k + (static_cast<i64>(key) * ks.heads + hm.k_head) * DQ + c);
            else zero16(&sm.k[j][c]);
          }
          if constexpr (!kLatent) {
            for (int u = t; u < kN * (DV / 8); u += kThreads) {
              const int j = u / (DV / 8), c = (u % (DV / 8)) * 8;
              const std::int32_t key = sm.key[j];
              if (key >= 0) copy16(&sm.v[j][c], ks.v + (static_cast<i64>(key) * ks.heads + hm.k_head) * ks.v_stride + c);
              else zero16(&sm.v[j][c]);
            }
          }
        });
        ex.sync();
        ex.warps([&](int w) {  // S = Q K^T
          for (int tile = w; tile < MT * (kN / 16); tile += kIndexWarps) {
            const int i = tile / (kN / 16), j = tile % (kN / 16);
            warp_mma<DQ, RowMajor, ColMajor, false>(&sm.s[16 * i][16 * j], kLds, &sm.q[16 * i][0], kLdq,
                                                    &sm.k[16 * j][0], kLdq);
          }
        });
        ex.sync();
        ex.each([&](int t, State&) {  // scaled, masked scores; each thread's share of its row's max
          const int r = t / kTpr, part = t % kTpr;
          float mx = neg_inf();
          for (int c = part * kCpt; c < (part + 1) * kCpt; ++c) {
            const float x = sm.key[c] >= 0 ? sm.s[r][c] * p.scale : neg_inf();
            sm.s[r][c] = x;
            mx = hd_max(mx, x);
          }
          sm.part[r][part] = mx;
        });
        ex.sync();
        ex.each([&](int t, State&) {
          for (int r = t; r < kM; r += kThreads) {
            float mx = sm.m[r];
            for (int x = 0; x < kTpr; ++x) mx = hd_max(mx, sm.part[r][x]);
            sm.mnew[r] = mx;
            sm.corr[r] = is_neg_inf(mx) ? 1.f : hd_exp(sm.m[r] - mx);
          }
        });
        ex.sync();
        ex.each([&](int t, State&) {  // P (bf16 for the product), each thread's share of its row's sum
          const int r = t / kTpr, part = t % kTpr;
          const float mn = sm.mnew[r];
          float sum = 0.f;
          for (int c = part * kCpt; c < (part + 1) * kCpt; ++c) {
            const float x = sm.s[r][c];
            const float pj = is_neg_inf(x) ? 0.f : hd_exp(x - mn);
            sm.p[r][c] = float_to_bf16(pj);
            sum += pj;
          }
          sm.part[r][part] = sum;
        });
        ex.sync();
        ex.each([&](int t, State&) {
          for (int r = t; r < kM; r += kThreads) {
            float sum = 0.f;
            for (int x = 0; x < kTpr; ++x) sum += sm.part[r][x];
            sm.l[r] = sm.l[r] * sm.corr[r] + sum;
            sm.m[r] = sm.mnew[r];
          }
          for (int i = t; i < kM * DV; i += kThreads) sm.o[i / DV][i % DV] *= sm.corr[i / DV];
        });
        ex.sync();
        const bf16* vt = kLatent ? &sm.k[0][0] : &sm.v[0][0];
        const int ldv = kLatent ? kLdq : kLdv;
        ex.warps([&](int w) {  // O += P V
          for (int tile = w; tile < MT * (DV / 16); tile += kIndexWarps) {
            const int i = tile / (DV / 16), j = tile % (DV / 16);
            warp_mma<kN, RowMajor, RowMajor, true>(&sm.o[16 * i][16 * j], kLdo, &sm.p[16 * i][0], kLdp, vt + 16 * j,
                                                   ldv);
          }
        });
      }
    }
    if (q_head < 0) return;
    ex.sync();
    ex.each([&](int t, State&) {
      for (int r = t; r < nh; r += kThreads) {
        if (!(sm.l[r] > 0.f)) continue;
        const float inv = 1.f / sm.l[r];
        const i64 rh = row * qs.heads + q_head + r;
        merge_into(qs.o_acc + rh * DV, qs.lse_acc + rh, [&](int d) { return sm.o[r][d] * inv; },
                   sm.m[r] + hd_log(sm.l[r]), DV);
      }
    });
  }
};

// ---------------------------------------------------------------- dQ
// dS = P (dP - delta), P = exp(scale S - lse), dP = dO V^T; dQ += scale dS K.
template <int DQ, int DV, int MT, bool kLatent = false>
struct IndexDqProgram {
  static_assert(DQ % 16 == 0 && DV % 16 == 0, "index programs: head dims multiple of 16");
  static constexpr int kThreads = kIndexThreads;
  static constexpr int kM = 16 * MT, kN = index_step(DQ);
  static constexpr int kLdq = DQ + 8, kLdv = DV + 8, kLdf = DQ + 4, kLds = kN + 4, kLdp = kN + 8;
  using State = IndexNoState;
  struct Smem {
    alignas(32) bf16 q[kM][kLdq];
    alignas(32) bf16 d_o[kM][kLdv];
    alignas(32) bf16 k[kN][kLdq];
    alignas(32) bf16 v[kLatent ? 1 : kN][kLdv];  // none with a shared latent
    alignas(32) float s[kM][kLds];
    alignas(32) float dp[kM][kLds];
    alignas(32) bf16 ds[kM][kLdp];
    alignas(32) float dq[kM][kLdf];
    float lse[kM], delta[kM];
    std::int32_t key[kN];
  };
  IndexLaunch p;

  template <class Exec>
  CPSCHED_HD void operator()(Exec& ex, int bx, int by, Smem& sm) const {
    const QSide& qs = p.q[p.major_buf];
    const i64 row = p.major[bx];
    const int slot = by % p.slots, h_lo = (by / p.slots) * kM;
    const int nh = hd_min(kM, p.hq / p.hkv - h_lo);
    ex.each([&](int t, State&) {
      for (int i = t; i < kM * kLdf; i += kThreads) (&sm.dq[0][0])[i] = 0.f;
    });
    int q_head = -1;
    for (int e = p.begin[bx]; e < p.begin[bx + 1]; ++e) {
      const IndexQItem it = p.q_items[e];
      IndexHeads hm;
      if (!index_heads(p, p.major_buf, it.other_buf, p.major_buf, it.group, slot, hm)) continue;
      if (q_head < 0) {
        q_head = hm.q_head + h_lo;
        ex.each([&](int t, State&) {
          for (int u = t; u < kM * (DQ / 8); u += kThreads) {
            const int r = u / (DQ / 8), c = (u % (DQ / 8)) * 8;
            if (r < nh) copy16(&sm.q[r][c], qs.q + (row * qs.heads + q_head + r) * DQ + c);
            else zero16(&sm.q[r][c]);
          }
          for (int u = t; u < kM * (DV / 8); u += kThreads) {
            const int r = u / (DV / 8), c = (u % (DV / 8)) * 8;
            if (r < nh) copy16(&sm.d_o[r][c], qs.d_o + (row * qs.heads + q_head + r) * DV + c);
            else zero16(&sm.d_o[r][c]);
          }
          for (int r = t; r < kM; r += kThreads) {
            const i64 rh = row * qs.heads + q_head + r;
            sm.lse[r] = r < nh ? qs.lse[rh] : 0.f;
            sm.delta[r] = r < nh ? qs.delta[rh] : 0.f;
          }
        });
      }
      const KSide& ks = p.k[it.other_buf];
      const std::int32_t* keys = p.indices + it.keys;
      for (int j0 = 0; j0 < it.width; j0 += kN) {
        ex.sync();
        ex.each([&](int t, State&) {
          for (int j = t; j < kN; j += kThreads) sm.key[j] = j0 + j < it.width ? keys[j0 + j] : -1;
        });
        ex.sync();
        ex.each([&](int t, State&) {
          for (int u = t; u < kN * (DQ / 8); u += kThreads) {
            const int j = u / (DQ / 8), c = (u % (DQ / 8)) * 8;
            const std::int32_t key = sm.key[j];
            if (key >= 0) copy16(&sm.k[j][c], ks.k + (static_cast<i64>(key) * ks.heads + hm.k_head) * DQ + c);
            else zero16(&sm.k[j][c]);
          }
          if constexpr (!kLatent) {
            for (int u = t; u < kN * (DV / 8); u += kThreads) {
              const int j = u / (DV / 8), c = (u % (DV / 8)) * 8;
              const std::int32_t key = sm.key[j];
              if (key >= 0) copy16(&sm.v[j][c], ks.v + (static_cast<i64>(key) * ks.heads + hm.k_head) * ks.v_stride + c);
              else zero16(&sm.v[j][c]);
            }
          }
        });
        ex.sync();
        const bf16* vt = kLatent ? &sm.k[0][0] : &sm.v[0][0];
        const int ldv = kLatent ? kLdq : kLdv;
        ex.warps([&](int w) {  // S = Q K^T and dP = dO V^T
          for (int tile = w; tile < 2 * MT * (kN / 16); tile += kIndexWarps) {
            const int which = tile / (MT * (kN / 16)), x = tile % (MT * (kN / 16));
            const int i = x / (kN / 16), j = x % (kN / 16);
            if (which == 0)
              warp_mma<DQ, RowMajor, ColMajor, false>(&sm.s[16 * i][16 * j], kLds, &sm.q[16 * i][0], kLdq,
                                                      &sm.k[16 * j][0], kLdq);
            else
              warp_mma<DV, RowMajor, ColMajor, false>(&sm.dp[16 * i][16 * j], kLds, &sm.d_o[16 * i][0], kLdv,
                                                      vt + 16 * j * ldv, ldv);
          }
        });
        ex.sync();
        ex.each([&](int t, State&) {
          for (int i = t; i < kM * kN; i += kThreads) {
            const int r = i / kN, c = i % kN;
            const float pj = sm.key[c] >= 0 ? hd_exp(sm.s[r][c] * p.scale - sm.lse[r]) : 0.f;
            sm.ds[r][c] = float_to_bf16(pj * (sm.dp[r][c] - sm.delta[r]));
          }
        });
        ex.sync();
        ex.warps([&](int w) {  // dQ += dS K
          for (int tile = w; tile < MT * (DQ / 16); tile += kIndexWarps) {
            const int i = tile / (DQ / 16), j = tile % (DQ / 16);
            warp_mma<kN, RowMajor, RowMajor, true>(&sm.dq[16 * i][16 * j], kLdf, &sm.ds[16 * i][0], kLdp,
                                                   &sm.k[0][16 * j], kLdq);
          }
        });
      }
    }
    if (q_head < 0) return;
    ex.sync();
    ex.each([&](int t, State&) {
      for (int i = t; i < nh * DQ; i += kThreads) {
        const int r = i / DQ, d = i % DQ;
        qs.dq_acc[(row * qs.heads + q_head + r) * DQ + d] += sm.dq[r][d] * p.scale;
      }
    });
  }
};

// ---------------------------------------------------------------- dK, dV
// dV += P^T dO, dK += scale dS^T Q over the selecting (row, head) pairs.
template <int DQ, int DV, bool kLatent = false>
struct IndexDkvProgram {
  static_assert(DQ % 16 == 0 && DV % 16 == 0, "index programs: head dims multiple of 16");
  static constexpr int kThreads = kIndexThreads;
  static constexpr int kT = kIndexColTile, kP = index_step(DQ);
  static constexpr int kLdq = DQ + 8, kLdv = DV + 8, kLdk = DQ + 4, kLdo = DV + 4, kLds = kP + 4, kLdp = kP + 8;
  using State = IndexNoState;
  struct Smem {
    alignas(32) bf16 k[kT][kLdq];
    alignas(32) bf16 v[kLatent ? 1 : kT][kLdv];  // none with a shared latent
    alignas(32) bf16 q[kP][kLdq];
    alignas(32) bf16 d_o[kP][kLdv];
    alignas(32) float st[kT][kLds];
    alignas(32) float dpt[kT][kLds];
    alignas(32) bf16 pt[kT][kLdp];
    alignas(32) bf16 dst[kT][kLdp];
    alignas(32) float dk[kT][kLdk];
    alignas(32) float dv[kT][kLdo];
    float lse[kP], delta[kP];
    std::uint32_t mask[kP];
  };
  IndexLaunch p;

  template <class Exec>
  CPSCHED_HD void operator()(Exec& ex, int bx, int slot, Smem& sm) const {
    const KSide& ks = p.k[p.major_buf];
    const i64 c0 = p.major[bx];
    const int ncols = static_cast<int>(hd_min<i64>(kT, ks.rows - c0));
    const int ratio = p.hq / p.hkv;
    ex.each([&](int t, State&) {
      for (int i = t; i < kT * kLdk; i += kThreads) (&sm.dk[0][0])[i] = 0.f;
      for (int i = t; i < kT * kLdo; i += kThreads) (&sm.dv[0][0])[i] = 0.f;
    });
    int k_head = -1;
    for (int e = p.begin[bx]; e < p.begin[bx + 1]; ++e) {
      const IndexKItem it = p.k_items[e];
      IndexHeads hm;
      if (!index_heads(p, it.other_buf, p.major_buf, p.major_buf, it.group, slot, hm)) continue;
      if (k_head < 0) {  // the tile's keys (latent rows), once
        k_head = hm.k_head;
        ex.each([&](int t, State&) {
          for (int u = t; u < kT * (DQ / 8); u += kThreads) {
            const int j = u / (DQ / 8), c = (u % (DQ / 8)) * 8;
            if (j < ncols) copy16(&sm.k[j][c], ks.k + ((c0 + j) * ks.heads + k_head) * DQ + c);
            else zero16(&sm.k[j][c]);
          }
          if constexpr (!kLatent) {
            for (int u = t; u < kT * (DV / 8); u += kThreads) {
              const int j = u / (DV / 8), c = (u % (DV / 8)) * 8;
              if (j < ncols) copy16(&sm.v[j][c], ks.v + ((c0 + j) * ks.heads + k_head) * ks.v_stride + c);
              else zero16(&sm.v[j][c]);
            }
          }
        });
      }
      const QSide& qs = p.q[it.other_buf];
      const i64 npairs = static_cast<i64>(it.count) * ratio;
      for (i64 p0 = 0; p0 < npairs; p0 += kP) {
        ex.sync();
        ex.each([&](int t, State&) {  // gather the step's (row, head) pairs: Q, dO, lse, delta, the row's mask
          if constexpr (DQ == DV) {  // one pass over both (GQA)
            for (int u = t; u < kP * (DQ / 8); u += kThreads) {
              const int j = u / (DQ / 8), c = (u % (DQ / 8)) * 8;
              const i64 pair = p0 + j;
              if (pair < npairs) {
                const i64 ur = it.first + pair / ratio;
                const i64 rh = static_cast<i64>(p.u_rows[ur]) * qs.heads + hm.q_head + pair % ratio;
                copy16(&sm.q[j][c], qs.q + rh * DQ + c);
                copy16(&sm.d_o[j][c], qs.d_o + rh * DV + c);
                if (c == 0) {
                  sm.lse[j] = qs.lse[rh];
                  sm.delta[j] = qs.delta[rh];
                  sm.mask[j] = p.u_masks[ur];
                }
              } else {
                zero16(&sm.q[j][c]);
                zero16(&sm.d_o[j][c]);
                if (c == 0) {
                  sm.lse[j] = 0.f;
                  sm.delta[j] = 0.f;
                  sm.mask[j] = 0u;
                }
              }
            }
          } else {  // MLA: Q rows of d_qk, dO rows of d_v
            for (int u = t; u < kP * (DQ / 8); u += kThreads) {
              const int j = u / (DQ / 8), c = (u % (DQ / 8)) * 8;
              const i64 pair = p0 + j;
              if (pair < npairs) {
                const i64 rh = static_cast<i64>(p.u_rows[it.first + pair / ratio]) * qs.heads + hm.q_head + pair % ratio;
                copy16(&sm.q[j][c], qs.q + rh * DQ + c);
              } else {
                zero16(&sm.q[j][c]);
              }
            }
            for (int u = t; u < kP * (DV / 8); u += kThreads) {
              const int j = u / (DV / 8), c = (u % (DV / 8)) * 8;
              const i64 pair = p0 + j;
              if (pair < npairs) {
                const i64 ur = it.first + pair / ratio;
                const i64 rh = static_cast<i64>(p.u_rows[ur]) * qs.heads + hm.q_head + pair % ratio;
                copy16(&sm.d_o[j][c], qs.d_o + rh * DV + c);
                if (c == 0) {
                  sm.lse[j] = qs.lse[rh];
                  sm.delta[j] = qs.delta[rh];
                  sm.mask[j] = p.u_masks[ur];
                }
              } else {
                zero16(&sm.d_o[j][c]);
                if (c == 0) {
                  sm.lse[j] = 0.f;
                  sm.delta[j] = 0.f;
                  sm.mask[j] = 0u;
                }
              }
            }
          }
        });
        ex.sync();
        const bf16* vt = kLatent ? &sm.k[0][0] : &sm.v[0][0];
        const int ldv = kLatent ? kLdq : kLdv;
        ex.warps([&](int w) {  // S^T = K Q^T and dP^T = V dO^T
          for (int tile = w; tile < 2 * (kP / 16); tile += kIndexWarps) {
            const int j = tile % (kP / 16);
            if (tile < kP / 16)
              warp_mma<DQ, RowMajor, ColMajor, false>(&sm.st[0][16 * j], kLds, &sm.k[0][0], kLdq, &sm.q[16 * j][0],
                                                      kLdq);
            else
              warp_mma<DV, RowMajor, ColMajor, false>(&sm.dpt[0][16 * j], kLds, vt, ldv, &sm.d_o[16 * j][0], kLdv);
          }
        });
        ex.sync();
        ex.each([&](int t, State&) {
          for (int i = t; i < kT * kP; i += kThreads) {
            const int c = i / kP, j = i % kP;
            const bool selected = (sm.mask[j] >> c) & 1u;
            const float pj = selected ? hd_exp(sm.st[c][j] * p.scale - sm.lse[j]) : 0.f;
            sm.pt[c][j] = float_to_bf16(pj);
            sm.dst[c][j] = float_to_bf16(pj * (sm.dpt[c][j] - sm.delta[j]));
          }
        });
        ex.sync();
        ex.warps([&](int w) {  // dV += P^T dO, dK += dS^T Q
          for (int tile = w; tile < DV / 16 + DQ / 16; tile += kIndexWarps) {
            if (tile < DV / 16)
              warp_mma<kP, RowMajor, RowMajor, true>(&sm.dv[0][16 * tile], kLdo, &sm.pt[0][0], kLdp,
                                                     &sm.d_o[0][16 * tile], kLdv);
            else
              warp_mma<kP, RowMajor, RowMajor, true>(&sm.dk[0][16 * (tile - DV / 16)], kLdk, &sm.dst[0][0], kLdp,
                                                     &sm.q[0][16 * (tile - DV / 16)], kLdq);
          }
        });
      }
    }
    if (k_head < 0) return;
    ex.sync();
    ex.each([&](int t, State&) {
      for (int i = t; i < ncols * DQ; i += kThreads) {
        const int c = i / DQ, d = i % DQ;
        ks.dk_acc[((c0 + c) * ks.heads + k_head) * DQ + d] += sm.dk[c][d] * p.scale;
      }
    });
    ex.sync();  // a shared latent: dV adds into what other threads just wrote
    ex.each([&](int t, State&) {
      for (int i = t; i < ncols * DV; i += kThreads) {
        const int c = i / DV, d = i % DV;
        ks.dv_acc[((c0 + c) * ks.heads + k_head) * ks.v_stride + d] += sm.dv[c][d];
      }
    });
  }
};

}  // namespace cpsched::gpu
