#pragma once
// The attention kernels as CTA programs, written once for the GPU and its CPU
// twin. A program runs one CTA (tile bx, head slot by) against an Exec that
// supplies the threads:
//   ex.each(f)  calls f(t, state) for every thread t of the CTA; on the GPU
//               each thread calls it once with its own registers as `state`,
//               on the CPU a loop calls it for t = 0..kTile-1 with an array;
//   ex.sync()   __syncthreads() on the GPU, nothing on the CPU.
//   ex.warps(f) f(w) once per warp w (index_programs.hpp's tile products).
// Code between those calls is uniform across the CTA. Thread t owns one row
// (q-major) or one col (k-major) of the tile; the other side is streamed
// through shared memory kChunk rows at a time. Scalar fp32 arithmetic on bf16
// inputs: these run the range args that cuDNN does not take (sdpa_batches.hpp).
//
// Index args (token top-k) have their own programs on tensor cores
// (index_programs.hpp); these run range args only.
//
// Head dims (docs/heads.md): DQ for Q and K rows (QK^T), DV for V, O and dO
// rows (GQA: DQ = DV). V (and dV) rows are read (written) at KSide::v_stride
// elements per head: DV, or DQ when V is the first DV dims of K's shared
// latent row; then v == k and dv_acc == dk_acc, and the one thread that owns
// a key adds its dV into the latent's gradient after its dK.
//
// Head mapping. A local row holds every head; a remote row only the heads of
// its split's group. The head slot `by` is the head index inside a row of the
// tiled buffer; an entry of group g uses global q head h = g*hq_g + (slot in
// group) and kv head h / (hq / hkv).
#include "kernel_params.hpp"

namespace cpsched::gpu {

// Global heads of entry `w` for slot `slot` of a q-major launch; false when
// the slot's head is not in the entry's group (local buffer only).
struct QHeads {
  int q_buf_head;   // head index inside a row of the q buffer (= slot)
  int k_buf_head;   // head index inside a row of the entry's k buffer
};

CPSCHED_HD inline bool q_major_heads(const AttnLaunch& p, const WorkEntry& w, int slot, QHeads& out) {
  const int hq_g = p.hq / p.groups, hkv_g = p.hkv / p.groups, ratio = p.hq / p.hkv;
  int g, h;
  if (p.major_buf == 0) {
    h = slot;
    g = h / hq_g;
    if (w.group >= 0 && w.group != g) return false;
  } else {
    g = w.group < 0 ? 0 : w.group;
    h = g * hq_g + slot;
  }
  const int kvh = h / ratio;
  out.q_buf_head = slot;
  out.k_buf_head = w.other_buf == 0 ? kvh : kvh - g * hkv_g;
  return true;
}

// k-major: the kv head of the slot and the q heads (first, count) reading it,
// as head indices inside rows of the entry's q buffer.
struct KHeads {
  int q_first;
  int q_count;
};

CPSCHED_HD inline bool k_major_heads(const AttnLaunch& p, const WorkEntry& w, int slot, KHeads& out) {
  const int hq_g = p.hq / p.groups, hkv_g = p.hkv / p.groups, ratio = p.hq / p.hkv;
  int g, kvh;
  if (p.major_buf == 0) {
    kvh = slot;
    g = kvh / hkv_g;
    if (w.group >= 0 && w.group != g) return false;
  } else {
    g = w.group < 0 ? 0 : w.group;
    kvh = g * hkv_g + slot;
  }
  out.q_first = kvh * ratio - (w.other_buf == 0 ? 0 : g * hq_g);
  out.q_count = ratio;
  return true;
}

// Merge of a normalised partial (o[d] * o_scale, lse) into an accumulator:
// lse = log(exp a + exp b), O = exp(a - lse) O_a + exp(b - lse) O_b. A
// partial with lse = -inf carries nothing.
template <class Load>
CPSCHED_HD inline void merge_into(float* acc_o, float* acc_lse, Load o, float lse, int dim) {
  if (is_neg_inf(lse)) return;
  const float a = *acc_lse;
  if (is_neg_inf(a)) {
    for (int d = 0; d < dim; ++d) acc_o[d] = o(d);
    *acc_lse = lse;
    return;
  }
  const float m = hd_max(a, lse);
  const float merged = m + hd_log(hd_exp(a - m) + hd_exp(lse - m));
  const float wa = hd_exp(a - merged), wb = hd_exp(lse - merged);
  for (int d = 0; d < dim; ++d) acc_o[d] = wa * acc_o[d] + wb * o(d);
  *acc_lse = merged;
}

// ---------------------------------------------------------------- forward
template <int DQ, int DV>
struct FwdProgram {
  static constexpr int kThreads = kTile;
  struct State {
    float acc[DV];
    float m;
    float l;
  };
  struct Smem {
    bf16 q[kTile][DQ + 2];  // padded: thread t reads row t, conflict-free
    bf16 k[kChunk][DQ];     // every thread reads the same row: broadcast
    bf16 v[kChunk][DV];
  };
  AttnLaunch p;

  template <class Exec>
  CPSCHED_HD void operator()(Exec& ex, int bx, int slot, Smem& sm) const {
    const QSide& qs = p.q[p.major_buf];
    const i64 r0 = p.tile_start[bx];
    const i64 nrows = hd_min<i64>(kTile, qs.rows - r0);
    ex.each([&](int t, State& st) {
      st.m = neg_inf();
      st.l = 0.f;
      for (int d = 0; d < DV; ++d) st.acc[d] = 0.f;
      if (t < nrows) {
        const bf16* src = qs.q + ((r0 + t) * qs.heads + slot) * DQ;
        for (int d = 0; d < DQ; ++d) sm.q[t][d] = src[d];
      }
    });
    for (int e = p.entry_begin[bx]; e < p.entry_begin[bx + 1]; ++e) {
      const WorkEntry w = p.entries[e];
      QHeads hm;
      if (!q_major_heads(p, w, slot, hm)) continue;
      const KSide& ks = p.k[w.other_buf];
      for (i64 c0 = w.loop_b; c0 < w.loop_e; c0 += kChunk) {
        const int nc = static_cast<int>(hd_min<i64>(kChunk, w.loop_e - c0));
        ex.sync();
        ex.each([&](int t, State&) {
          for (int i = t; i < nc * DQ; i += kTile) {
            const int j = i / DQ, d = i % DQ;
            sm.k[j][d] = ks.k[((c0 + j) * ks.heads + hm.k_buf_head) * DQ + d];
          }
          for (int i = t; i < nc * DV; i += kTile) {
            const int j = i / DV, d = i % DV;
            sm.v[j][d] = ks.v[((c0 + j) * ks.heads + hm.k_buf_head) * ks.v_stride + d];
          }
        });
        ex.sync();
        ex.each([&](int t, State& st) {
          const i64 row = r0 + t;
          if (row < w.major_b || row >= w.major_e) return;
          const Iv rc = row_cols(w.band, row);
          const i64 cb = hd_max(rc.b, c0), ce = hd_min(rc.e, c0 + nc);
          if (cb >= ce) return;
          float s[kChunk];
          float mx = neg_inf();
          CPSCHED_UNROLL
          for (int j = 0; j < kChunk; ++j) {
            const i64 c = c0 + j;
            float x = neg_inf();
            if (c >= cb && c < ce) {
              float dot = 0.f;
              for (int d = 0; d < DQ; ++d) dot += bf16_to_float(sm.q[t][d]) * bf16_to_float(sm.k[j][d]);
              x = dot * p.scale;
            }
            s[j] = x;
            mx = hd_max(mx, x);
          }
          const float m_new = hd_max(st.m, mx);
          const float corr = hd_exp(st.m - m_new);
          st.l *= corr;
          for (int d = 0; d < DV; ++d) st.acc[d] *= corr;
          CPSCHED_UNROLL
          for (int j = 0; j < kChunk; ++j) {
            if (is_neg_inf(s[j])) continue;
            const float pj = hd_exp(s[j] - m_new);
            st.l += pj;
            for (int d = 0; d < DV; ++d) st.acc[d] += pj * bf16_to_float(sm.v[j][d]);
          }
          st.m = m_new;
        });
      }
    }
    ex.each([&](int t, State& st) {
      if (t >= nrows || !(st.l > 0.f)) return;
      const float inv = 1.f / st.l;
      const i64 rh = (r0 + t) * qs.heads + slot;
      merge_into(qs.o_acc + rh * DV, qs.lse_acc + rh, [&](int d) { return st.acc[d] * inv; },
                 st.m + hd_log(st.l), DV);
    });
  }
};

// ---------------------------------------------------------------- dQ
// dS = P (dP - delta), P = exp(scale S - lse), dP = dO V^T; dQ += scale dS K.
template <int DQ, int DV>
struct DqProgram {
  static constexpr int kThreads = kTile;
  struct State {
    float dq[DQ];
    float lse;
    float delta;
    bool touched;
  };
  struct Smem {
    bf16 q[kTile][DQ + 2];
    bf16 d_o[kTile][DV + 2];
    bf16 k[kChunk][DQ];
    bf16 v[kChunk][DV];
  };
  AttnLaunch p;

  template <class Exec>
  CPSCHED_HD void operator()(Exec& ex, int bx, int slot, Smem& sm) const {
    const QSide& qs = p.q[p.major_buf];
    const i64 r0 = p.tile_start[bx];
    const i64 nrows = hd_min<i64>(kTile, qs.rows - r0);
    ex.each([&](int t, State& st) {
      st.touched = false;
      st.lse = 0.f;
      st.delta = 0.f;
      for (int d = 0; d < DQ; ++d) st.dq[d] = 0.f;
      if (t < nrows) {
        const i64 rh = (r0 + t) * qs.heads + slot;
        for (int d = 0; d < DQ; ++d) sm.q[t][d] = qs.q[rh * DQ + d];
        for (int d = 0; d < DV; ++d) sm.d_o[t][d] = qs.d_o[rh * DV + d];
        st.lse = qs.lse[rh];
        st.delta = qs.delta[rh];
      }
    });
    for (int e = p.entry_begin[bx]; e < p.entry_begin[bx + 1]; ++e) {
      const WorkEntry w = p.entries[e];
      QHeads hm;
      if (!q_major_heads(p, w, slot, hm)) continue;
      const KSide& ks = p.k[w.other_buf];
      for (i64 c0 = w.loop_b; c0 < w.loop_e; c0 += kChunk) {
        const int nc = static_cast<int>(hd_min<i64>(kChunk, w.loop_e - c0));
        ex.sync();
        ex.each([&](int t, State&) {
          for (int i = t; i < nc * DQ; i += kTile) {
            const int j = i / DQ, d = i % DQ;
            sm.k[j][d] = ks.k[((c0 + j) * ks.heads + hm.k_buf_head) * DQ + d];
          }
          for (int i = t; i < nc * DV; i += kTile) {
            const int j = i / DV, d = i % DV;
            sm.v[j][d] = ks.v[((c0 + j) * ks.heads + hm.k_buf_head) * ks.v_stride + d];
          }
        });
        ex.sync();
        ex.each([&](int t, State& st) {
          const i64 row = r0 + t;
          if (row < w.major_b || row >= w.major_e) return;
          const Iv rc = row_cols(w.band, row);
          const i64 cb = hd_max(rc.b, c0), ce = hd_min(rc.e, c0 + nc);
          if (cb >= ce) return;
          st.touched = true;
          for (int j = static_cast<int>(cb - c0); j < static_cast<int>(ce - c0); ++j) {
            float s = 0.f, dp = 0.f;
            for (int d = 0; d < DQ; ++d) s += bf16_to_float(sm.q[t][d]) * bf16_to_float(sm.k[j][d]);
            for (int d = 0; d < DV; ++d) dp += bf16_to_float(sm.d_o[t][d]) * bf16_to_float(sm.v[j][d]);
            const float pj = hd_exp(s * p.scale - st.lse);
            const float ds = pj * (dp - st.delta);
            for (int d = 0; d < DQ; ++d) st.dq[d] += ds * bf16_to_float(sm.k[j][d]);
          }
        });
      }
    }
    ex.each([&](int t, State& st) {
      if (t >= nrows || !st.touched) return;
      float* dst = qs.dq_acc + ((r0 + t) * qs.heads + slot) * DQ;
      for (int d = 0; d < DQ; ++d) dst[d] += st.dq[d] * p.scale;
    });
  }
};

// ---------------------------------------------------------------- dK, dV
// dV += P^T dO, dK += scale dS^T Q, summed over the q heads of the kv head.
template <int DQ, int DV>
struct DkvProgram {
  static constexpr int kThreads = kTile;
  struct State {
    float dk[DQ];
    float dv[DV];
    bool touched;
  };
  struct Smem {
    bf16 k[kTile][DQ + 2];
    bf16 v[kTile][DV + 2];
    bf16 q[kChunk][DQ];
    bf16 d_o[kChunk][DV];
    float lse[kChunk];
    float delta[kChunk];
  };
  AttnLaunch p;

  template <class Exec>
  CPSCHED_HD void operator()(Exec& ex, int bx, int slot, Smem& sm) const {
    const KSide& ks = p.k[p.major_buf];
    const i64 c0 = p.tile_start[bx];
    const i64 ncols = hd_min<i64>(kTile, ks.rows - c0);
    ex.each([&](int t, State& st) {
      st.touched = false;
      for (int d = 0; d < DQ; ++d) st.dk[d] = 0.f;
      for (int d = 0; d < DV; ++d) st.dv[d] = 0.f;
      if (t < ncols) {
        const i64 kh = (c0 + t) * ks.heads + slot;
        for (int d = 0; d < DQ; ++d) sm.k[t][d] = ks.k[kh * DQ + d];
        for (int d = 0; d < DV; ++d) sm.v[t][d] = ks.v[kh * ks.v_stride + d];
      }
    });
    for (int e = p.entry_begin[bx]; e < p.entry_begin[bx + 1]; ++e) {
      const WorkEntry w = p.entries[e];
      KHeads hm;
      if (!k_major_heads(p, w, slot, hm)) continue;
      const QSide& qs = p.q[w.other_buf];
      for (int hh = 0; hh < hm.q_count; ++hh) {
        const int qh = hm.q_first + hh;
        for (i64 r0 = w.loop_b; r0 < w.loop_e; r0 += kChunk) {
          const int nr = static_cast<int>(hd_min<i64>(kChunk, w.loop_e - r0));
          ex.sync();
          ex.each([&](int t, State&) {
            for (int i = t; i < nr * DQ; i += kTile) {
              const int j = i / DQ, d = i % DQ;
              sm.q[j][d] = qs.q[((r0 + j) * qs.heads + qh) * DQ + d];
            }
            for (int i = t; i < nr * DV; i += kTile) {
              const int j = i / DV, d = i % DV;
              sm.d_o[j][d] = qs.d_o[((r0 + j) * qs.heads + qh) * DV + d];
            }
            if (t < nr) {
              sm.lse[t] = qs.lse[(r0 + t) * qs.heads + qh];
              sm.delta[t] = qs.delta[(r0 + t) * qs.heads + qh];
            }
          });
          ex.sync();
          ex.each([&](int t, State& st) {
            const i64 col = c0 + t;
            if (col < w.major_b || col >= w.major_e) return;
            const Iv cr = col_rows(w.band, col);
            const i64 rb = hd_max(cr.b, r0), re = hd_min(cr.e, r0 + nr);
            if (rb >= re) return;
            st.touched = true;
            for (int j = static_cast<int>(rb - r0); j < static_cast<int>(re - r0); ++j) {
              float s = 0.f, dp = 0.f;
              for (int d = 0; d < DQ; ++d) s += bf16_to_float(sm.q[j][d]) * bf16_to_float(sm.k[t][d]);
              for (int d = 0; d < DV; ++d) dp += bf16_to_float(sm.d_o[j][d]) * bf16_to_float(sm.v[t][d]);
              const float pj = hd_exp(s * p.scale - sm.lse[j]);
              const float ds = pj * (dp - sm.delta[j]);
              for (int d = 0; d < DV; ++d) st.dv[d] += pj * bf16_to_float(sm.d_o[j][d]);
              for (int d = 0; d < DQ; ++d) st.dk[d] += ds * bf16_to_float(sm.q[j][d]);
            }
          });
        }
      }
    }
    ex.each([&](int t, State& st) {
      if (t >= ncols || !st.touched) return;
      const i64 kh = (c0 + t) * ks.heads + slot;
      for (int d = 0; d < DQ; ++d) ks.dk_acc[kh * DQ + d] += st.dk[d] * p.scale;
      // A shared latent: dv_acc is dk_acc, so dV lands on the latent's first DV dims.
      for (int d = 0; d < DV; ++d) ks.dv_acc[kh * ks.v_stride + d] += st.dv[d];
    });
  }
};

}  // namespace cpsched::gpu
