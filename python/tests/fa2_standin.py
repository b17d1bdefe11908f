"""A CPU stand-in with the documented semantics of FlashAttention-2's varlen kernels, for the `aten` and
`flash` backends' batching (no GPU here).

What it reproduces, per sequence b of a varlen batch (Lq = cu_q[b+1] - cu_q[b] rows, Lk keys, d = Lk - Lq):
row i sees key j when i + d - left <= j <= i + d + right (bottom-right aligned; -1 is unbounded; is_causal is
(-1, 0)); scores are scale q.k in fp32; a row that sees no key gets O = 0 and LSE = +inf; the LSE of varlen
mode is [heads, total_q] fp32; GQA by heads_q a multiple of heads_k; O, dQ, dK, dV in the inputs' dtype. The
backward takes any O and LSE (P = exp(S - LSE) under the mask, dS = P (dP - delta), delta = rowsum(dO O)).

`AtenOps` has the call signatures of torch.ops.aten._flash_attention_forward / _backward (torch 2.11 and
2.15); `MetaChecked(AtenOps())` also runs every call's arguments through the real ops on `meta` tensors (the
schemas of the installed torch) and checks that the stand-in returned the shapes, dtypes and layouts the real
op declares. `flash_kernels()` gives the flash backend's kernel pair (flash-attn's call shapes). The
stand-in also takes fp32 (the real kernels do not), so that the batching is checked at fp32 precision.
"""
from __future__ import annotations

import torch

_INF = float("inf")


def _mask(lq, lk, causal, left, right):
    if causal:
        right = 0
    d = lk - lq
    i = torch.arange(lq).unsqueeze(1)
    j = torch.arange(lk).unsqueeze(0)
    m = torch.ones(lq, lk, dtype=torch.bool)
    if left >= 0:
        m &= j >= i + d - left
    if right >= 0:
        m &= j <= i + d + right
    return m


def _seqs(cu):
    c = [int(x) for x in cu.tolist()]
    return list(zip(c[:-1], c[1:]))


def _heads_kv(x, r):
    return x.repeat_interleave(r, dim=1)  # [n, hk, d] -> [n, hk * r, d]: query head h reads KV head h // r


def varlen_forward(q, k, v, cu_q, cu_k, scale, causal, left=-1, right=-1):
    """-> O [total_q, Hq, dv] (q's dtype), LSE fp32 [Hq, total_q] (+inf where a row sees no key)."""
    hq, hk = q.shape[1], k.shape[1]
    r = hq // hk
    o = torch.zeros(q.shape[0], hq, v.shape[-1], dtype=q.dtype)
    lse = torch.full((hq, q.shape[0]), _INF)
    for (a, b), (c, e) in zip(_seqs(cu_q), _seqs(cu_k)):
        if b == a:
            continue
        m = _mask(b - a, e - c, causal, left, right)
        qq = q[a:b].float().transpose(0, 1)
        kk = _heads_kv(k[c:e].float(), r).transpose(0, 1)
        vv = _heads_kv(v[c:e].float(), r).transpose(0, 1)
        s = torch.matmul(qq, kk.transpose(1, 2)) * scale
        s = s.masked_fill(~m, -_INF)
        ls = torch.logsumexp(s, -1)  # [H, Lq], -inf where no key
        p = torch.exp(s - ls.nan_to_num(neginf=0.0).unsqueeze(-1)).masked_fill(~m, 0.0)
        o[a:b] = torch.matmul(p, vv).transpose(0, 1).to(q.dtype)
        lse[:, a:b] = torch.where(torch.isinf(ls), torch.full_like(ls, _INF), ls)
    return o, lse


def varlen_backward(do, q, k, v, o, lse, cu_q, cu_k, scale, causal, left=-1, right=-1):
    """-> dQ, dK, dV in the inputs' dtype; lse [Hq, total_q] (+inf or -inf: the row has P = 0)."""
    hq, hk = q.shape[1], k.shape[1]
    r = hq // hk
    dq = torch.zeros(q.shape, dtype=torch.float32)
    dk = torch.zeros(k.shape, dtype=torch.float32)
    dv = torch.zeros(v.shape, dtype=torch.float32)
    for (a, b), (c, e) in zip(_seqs(cu_q), _seqs(cu_k)):
        if b == a or e == c:
            continue
        m = _mask(b - a, e - c, causal, left, right)
        qq = q[a:b].float().transpose(0, 1)
        kk = _heads_kv(k[c:e].float(), r).transpose(0, 1)
        vv = _heads_kv(v[c:e].float(), r).transpose(0, 1)
        dd = do[a:b].float().transpose(0, 1)
        ls = lse[:, a:b].float().unsqueeze(-1)
        dead = torch.isinf(ls)
        p = torch.exp(torch.matmul(qq, kk.transpose(1, 2)) * scale - ls.masked_fill(dead, 0.0))
        p = p.masked_fill(~m, 0.0).masked_fill(dead, 0.0)
        delta = (do[a:b].float() * o[a:b].float()).sum(-1).transpose(0, 1).unsqueeze(-1)
        ds = p * (torch.matmul(dd, vv.transpose(1, 2)) - delta)
        dq[a:b] = (torch.matmul(ds, kk) * scale).transpose(0, 1)
        gk = (torch.matmul(ds.transpose(1, 2), qq) * scale).transpose(0, 1)  # [Lk, Hq, d]
        gv = torch.matmul(p.transpose(1, 2), dd).transpose(0, 1)
        dk[c:e] = gk.reshape(e - c, hk, r, -1).sum(2)
        dv[c:e] = gv.reshape(e - c, hk, r, -1).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class AtenOps:
    """torch.ops.aten._flash_attention_forward / _backward's call shapes on the stand-in; `calls` records each
    call's mask arguments (is_causal, window_size_left, window_size_right)."""

    def __init__(self):
        self.calls = []

    def _flash_attention_forward(self, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                                 return_debug_mask, *, scale=None, window_size_left=None, window_size_right=None,
                                 seqused_k=None, alibi_slopes=None):
        assert dropout_p == 0.0 and not return_debug_mask and seqused_k is None and alibi_slopes is None
        assert cum_seq_q.dtype == torch.int32 and cum_seq_k.dtype == torch.int32
        lens_q = (cum_seq_q[1:] - cum_seq_q[:-1]).tolist()
        lens_k = (cum_seq_k[1:] - cum_seq_k[:-1]).tolist()
        assert max(lens_q) <= max_q and max(lens_k) <= max_k, (lens_q, max_q, lens_k, max_k)
        scale = query.shape[-1] ** -0.5 if scale is None else scale
        wl = -1 if window_size_left is None else window_size_left
        wr = -1 if window_size_right is None else window_size_right
        self.calls.append(("fwd", bool(is_causal), wl, wr))
        o, lse = varlen_forward(query, key, value, cum_seq_q, cum_seq_k, scale, is_causal, wl, wr)
        rng = torch.empty(2, dtype=torch.uint64)
        return o, lse, rng, torch.empty((), dtype=torch.uint64), torch.empty(0, dtype=query.dtype)

    def _flash_attention_backward(self, grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
                                  max_k, dropout_p, is_causal, rng_state, unused, *, scale=None,
                                  window_size_left=None, window_size_right=None):
        assert dropout_p == 0.0
        assert logsumexp.shape == (query.shape[1], query.shape[0]) and logsumexp.is_contiguous()
        scale = query.shape[-1] ** -0.5 if scale is None else scale
        wl = -1 if window_size_left is None else window_size_left
        wr = -1 if window_size_right is None else window_size_right
        self.calls.append(("bwd", bool(is_causal), wl, wr))
        return varlen_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, scale, is_causal,
                               wl, wr)


def _meta(x):
    if isinstance(x, torch.Tensor):
        # the real ops take half precision only: meta copies of fp32 inputs in bf16, same shape and strides
        dt = torch.bfloat16 if x.dtype == torch.float32 and x.dim() == 3 else x.dtype
        return torch.empty_strided(x.shape, x.stride(), dtype=dt, device="meta")
    return x


class MetaChecked:
    """Calls `inner` and, with the same arguments as meta tensors, the real torch.ops.aten op (its schema and
    meta kernel): the argument names and types must fit the installed torch's schema, and the stand-in's
    outputs must have the real op's shapes (the varlen LSE [heads, total_q]) and dtypes (fp32 LSE)."""

    def __init__(self, inner):
        self.inner = inner
        self.checked = 0

    def __getattr__(self, name):
        real = getattr(torch.ops.aten, name)
        mine = getattr(self.inner, name)

        def call(*args, **kw):
            want = real(*[_meta(a) for a in args], **{k: _meta(v) for k, v in kw.items()})
            got = mine(*args, **kw)
            n = 2 if name == "_flash_attention_forward" else 3
            for i, (g, w) in enumerate(zip(got[:n], want[:n])):
                assert tuple(g.shape) == tuple(w.shape), (name, i, tuple(g.shape), tuple(w.shape))
                if w.dtype == torch.float32:
                    assert g.dtype == torch.float32, (name, i, g.dtype)
            self.checked += 1
            return got
        return call


def flash_kernels():
    """(fwd, bwd) with the flash backend's kernel signatures (flash-attn's semantics) on the stand-in."""
    def fwd(q, k, v, cu_q, cu_k, mq, mk, scale, causal, window):
        o, lse = varlen_forward(q, k, v, cu_q, cu_k, scale, causal, window[0], window[1])
        return o, lse.transpose(0, 1)

    def bwd(do, q, k, v, o, lse_hn, dq, dk, dv, cu_q, cu_k, mq, mk, scale, causal, window):
        gq, gk, gv = varlen_backward(do, q, k, v, o, lse_hn, cu_q, cu_k, scale, causal, window[0], window[1])
        dq.copy_(gq), dk.copy_(gk), dv.copy_(gv)
    return fwd, bwd
