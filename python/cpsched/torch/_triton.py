"""Index args (token top-k: DSA) on Triton kernels, forward and backward (docs/torch.md, "Backends").

An index arg computes query row i of its q rows against the rows idx[i, :] of its k buffer (-1: padding); the
torch reference gathers the selected rows and runs the scores in fp32 (_kernels.index_forward). Here one
program takes one query token and one KV head: the query heads that share that KV head are the rows of its
matrices (a tile of BLOCK_H heads: DSA's 128 heads per latent fill two tiles of 64), and it walks the token's
selected keys in blocks of BLOCK_N, gathering each block's K (and V) rows from the index row. The scores, an
online softmax in fp32 (exp2) and O = P V are tensor-core dots (tl.dot). With MLA's shared latent (V is K's
first d_v columns) a key's row is read once: the dots split K's columns at d_v (chunk A, also V; chunk B, the
rest), so chunk A serves both S = Q K^T and O = P V. Output: O fp32 [n, Hq, d_v] and lse fp32 (natural log;
-inf and O = 0 for a row with no valid key), as the torch kernel returns them.

The backward recomputes P from the final lse (exp2(S - lse)), dP = dO V^T, dS = P (dP - delta) and writes
dQ of its rows (each program owns its query's heads: a plain load-add-store into the fp32 accumulator); dK
and dV go to the selected keys' rows with fp32 atomic adds (several queries select one key), the latent's
chunk A receiving dK_A + dV in one add. Atomic adds make dK / dV's summation order vary between runs (as in
FA2's backward): equal up to fp32 rounding, not bitwise.

Runs on CUDA tensors; on CPU tensors under Triton's interpreter when TRITON_INTERPRET=1 is set (the tests):
Triton's rule is that it is set before triton is first imported (its standard library is jitted at import).
The kernels are built at first use for the mode the environment gives then, and kept per mode. Triton 3.9's
interpreter computes tl.dot of bf16 operands wrongly (measured on a 16 x 16 product: an error of 3e10; fp16
ones were right), so under the interpreter the operands are cast to fp32 first; compiled, half-precision
operands go to the tensor cores as they are and fp32 ones use IEEE precision (no TF32).
"""
from __future__ import annotations

import functools
import os
import threading

import torch

LOG2E = 1.4426950408889634
_LOCK = threading.Lock()
_BUILT = {}
LAUNCHES = {"fwd": 0, "bwd": 0}  # kernel launches of this process (tests, benchmarks)


@functools.lru_cache(maxsize=None)
def _triton_imports():
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
        return True
    except Exception:  # noqa: BLE001 - not installed, or a build that does not import here
        return False


def _interpreting():
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_unavailable(device, dtype, tp=None):
    """Why the Triton index kernels cannot run here (a sentence), or None when they can."""
    if not _triton_imports():
        return "triton is not installed (it ships with CUDA builds of torch), or does not import here"
    if device.type == "cpu" and not _interpreting():
        return "the Triton kernels run on CUDA tensors (on CPU tensors only under TRITON_INTERPRET=1)"
    if device.type not in ("cpu", "cuda"):
        return f"the Triton kernels run on CUDA tensors; q is on {device}"
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"the Triton kernels take float16, bfloat16 or float32, q is {dtype}"
    return None


def _build():
    """The jitted kernels for the current mode (compiled, or interpreted under TRITON_INTERPRET=1)."""
    mode = _interpreting()
    hit = _BUILT.get(mode)
    if hit is not None:
        return hit
    with _LOCK:
        hit = _BUILT.get(mode)
        if hit is None:
            hit = _BUILT[mode] = _define()
    return hit


def _define():
    import triton
    import triton.language as tl

    @triton.jit
    def fwd(Q, K, V, IDX, O, LSE, W, r, sq0, sq1, sk0, sk1, sv0, sv1, si0, so0, so1, sl0, scale2,
            DA: tl.constexpr, DB: tl.constexpr, DV: tl.constexpr, BDA: tl.constexpr, BDB: tl.constexpr,
            BDV: tl.constexpr, SHARED: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
            UPCAST: tl.constexpr, PREC: tl.constexpr):
        i = tl.program_id(0)
        g = tl.program_id(1)
        hh = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
        hm = hh < r
        head = g * r + hh
        da = tl.arange(0, BDA)
        qa = tl.load(Q + i * sq0 + head[:, None] * sq1 + da[None, :], mask=hm[:, None] & (da < DA)[None, :],
                     other=0.0)
        if UPCAST:
            qa = qa.to(tl.float32)
        if DB > 0:
            db = tl.arange(0, BDB)
            qb = tl.load(Q + i * sq0 + head[:, None] * sq1 + DA + db[None, :],
                         mask=hm[:, None] & (db < DB)[None, :], other=0.0)
            if UPCAST:
                qb = qb.to(tl.float32)
        dvv = tl.arange(0, BDV)
        m = tl.full((BLOCK_H,), float("-inf"), tl.float32)
        lsum = tl.zeros((BLOCK_H,), tl.float32)
        acc = tl.zeros((BLOCK_H, BDV), tl.float32)
        for j0 in range(0, W, BLOCK_N):
            jj = j0 + tl.arange(0, BLOCK_N)
            kid = tl.load(IDX + i * si0 + jj, mask=jj < W, other=-1)
            ok = kid >= 0
            rows = tl.where(ok, kid, 0).to(tl.int64)
            ka = tl.load(K + rows[:, None] * sk0 + g * sk1 + da[None, :], mask=ok[:, None] & (da < DA)[None, :],
                         other=0.0)
            if UPCAST:
                ka = ka.to(tl.float32)
            s = tl.dot(qa, tl.trans(ka), input_precision=PREC)
            if DB > 0:
                kb = tl.load(K + rows[:, None] * sk0 + g * sk1 + DA + db[None, :],
                             mask=ok[:, None] & (db < DB)[None, :], other=0.0)
                if UPCAST:
                    kb = kb.to(tl.float32)
                s += tl.dot(qb, tl.trans(kb), input_precision=PREC)
            s = tl.where(ok[None, :], s * scale2, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            lsum = lsum * alpha + tl.sum(p, 1)
            if SHARED:
                vv = ka
            else:
                vv = tl.load(V + rows[:, None] * sv0 + g * sv1 + dvv[None, :], mask=ok[:, None] & (dvv < DV)[None, :],
                             other=0.0)
                if UPCAST:
                    vv = vv.to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p.to(vv.dtype), vv, input_precision=PREC)
            m = m_new
        has = lsum > 0
        o = acc / tl.where(has, lsum, 1.0)[:, None]
        lse = tl.where(has, (m + tl.log2(tl.where(has, lsum, 1.0))) / 1.4426950408889634, float("-inf"))
        tl.store(O + i * so0 + head[:, None] * so1 + dvv[None, :], o, mask=hm[:, None] & (dvv < DV)[None, :])
        tl.store(LSE + i * sl0 + head, lse, mask=hm)

    @triton.jit
    def bwd(Q, K, V, DO, LSE, DELTA, IDX, DQ, DK, DV_, W, r, sq0, sq1, sk0, sk1, sv0, sv1, sd0, sd1, sl0, st0,
            si0, sdq0, sdq1, sdk0, sdk1, sdv0, sdv1, scale, scale2,
            DA: tl.constexpr, DB: tl.constexpr, DV: tl.constexpr, BDA: tl.constexpr, BDB: tl.constexpr,
            BDV: tl.constexpr, SHARED: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
            UPCAST: tl.constexpr, PREC: tl.constexpr):
        i = tl.program_id(0)
        g = tl.program_id(1)
        hh = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
        hm = hh < r
        head = g * r + hh
        da = tl.arange(0, BDA)
        dvv = tl.arange(0, BDV)
        qa = tl.load(Q + i * sq0 + head[:, None] * sq1 + da[None, :], mask=hm[:, None] & (da < DA)[None, :],
                     other=0.0)
        if UPCAST:
            qa = qa.to(tl.float32)
        if DB > 0:
            db = tl.arange(0, BDB)
            qb = tl.load(Q + i * sq0 + head[:, None] * sq1 + DA + db[None, :],
                         mask=hm[:, None] & (db < DB)[None, :], other=0.0)
            if UPCAST:
                qb = qb.to(tl.float32)
            dqb = tl.zeros((BLOCK_H, BDB), tl.float32)
        do = tl.load(DO + i * sd0 + head[:, None] * sd1 + dvv[None, :], mask=hm[:, None] & (dvv < DV)[None, :],
                     other=0.0)
        if UPCAST:
            do = do.to(tl.float32)
        lse = tl.load(LSE + i * sl0 + head, mask=hm, other=float("-inf"))
        # a row without any key anywhere (lse -inf) has P = 0: +inf makes exp2(s - lse) vanish
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
        delta = tl.load(DELTA + i * st0 + head, mask=hm, other=0.0)
        dqa = tl.zeros((BLOCK_H, BDA), tl.float32)
        for j0 in range(0, W, BLOCK_N):
            jj = j0 + tl.arange(0, BLOCK_N)
            kid = tl.load(IDX + i * si0 + jj, mask=jj < W, other=-1)
            ok = kid >= 0
            rows = tl.where(ok, kid, 0).to(tl.int64)
            ka = tl.load(K + rows[:, None] * sk0 + g * sk1 + da[None, :], mask=ok[:, None] & (da < DA)[None, :],
                         other=0.0)
            if UPCAST:
                ka = ka.to(tl.float32)
            s = tl.dot(qa, tl.trans(ka), input_precision=PREC)
            if DB > 0:
                kb = tl.load(K + rows[:, None] * sk0 + g * sk1 + DA + db[None, :],
                             mask=ok[:, None] & (db < DB)[None, :], other=0.0)
                if UPCAST:
                    kb = kb.to(tl.float32)
                s += tl.dot(qb, tl.trans(kb), input_precision=PREC)
            p = tl.exp2(s * scale2 - lse2[:, None])
            p = tl.where(ok[None, :] & hm[:, None], p, 0.0)
            if SHARED:
                vv = ka
            else:
                vv = tl.load(V + rows[:, None] * sv0 + g * sv1 + dvv[None, :], mask=ok[:, None] & (dvv < DV)[None, :],
                             other=0.0)
                if UPCAST:
                    vv = vv.to(tl.float32)
            dp = tl.dot(do, tl.trans(vv), input_precision=PREC)
            ds = p * (dp - delta[:, None])
            dsc = ds.to(qa.dtype)
            dqa += tl.dot(dsc, ka, input_precision=PREC)
            dka = tl.dot(tl.trans(dsc), qa, input_precision=PREC) * scale
            dvb = tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC)
            okm = ok[:, None]
            if SHARED:  # chunk A is also V: one add of dK_A + dV
                tl.atomic_add(DK + rows[:, None] * sdk0 + g * sdk1 + da[None, :], dka + dvb,
                              mask=okm & (da < DA)[None, :], sem="relaxed")
            else:
                tl.atomic_add(DK + rows[:, None] * sdk0 + g * sdk1 + da[None, :], dka, mask=okm & (da < DA)[None, :],
                              sem="relaxed")
                tl.atomic_add(DV_ + rows[:, None] * sdv0 + g * sdv1 + dvv[None, :], dvb,
                              mask=okm & (dvv < DV)[None, :], sem="relaxed")
            if DB > 0:
                dqb += tl.dot(dsc, kb, input_precision=PREC)
                dkb = tl.dot(tl.trans(dsc), qb, input_precision=PREC) * scale
                tl.atomic_add(DK + rows[:, None] * sdk0 + g * sdk1 + DA + db[None, :], dkb,
                              mask=okm & (db < DB)[None, :], sem="relaxed")
        pa = DQ + i * sdq0 + head[:, None] * sdq1 + da[None, :]
        ma = hm[:, None] & (da < DA)[None, :]
        tl.store(pa, tl.load(pa, mask=ma, other=0.0) + dqa * scale, mask=ma)
        if DB > 0:
            pb = DQ + i * sdq0 + head[:, None] * sdq1 + DA + db[None, :]
            mb = hm[:, None] & (db < DB)[None, :]
            tl.store(pb, tl.load(pb, mask=mb, other=0.0) + dqb * scale, mask=mb)

    return fwd, bwd


class _launching:
    """Under the interpreter one launch at a time: Triton's interpreter patches triton.language while a kernel
    runs, which threads (loopback ranks) would undo under each other. Compiled launches need no lock."""

    def __init__(self, interp):
        self.interp = interp

    def __enter__(self):
        if self.interp:
            _RUN_LOCK.acquire()

    def __exit__(self, *exc):
        if self.interp:
            _RUN_LOCK.release()


_RUN_LOCK = threading.Lock()


def _p2(n):
    return max(16, 1 << max(0, (int(n) - 1).bit_length()))


def _shared(kbuf, vbuf):
    """Whether V is K's first d_v columns (MLA's shared latent): the same rows, read once."""
    return vbuf.data_ptr() == kbuf.data_ptr() and vbuf.stride() == kbuf.stride() and vbuf.shape[:2] == kbuf.shape[:2]


def config(r, dqk, dv, shared, block_h=None, block_n=None):
    """(BLOCK_H, BLOCK_N, num_warps) for r query heads per KV head and the head dims. Not tuned on a GPU yet
    (python/bench/bench_torch_cuda.py --triton-sweep measures the alternatives)."""
    wide = dqk + (0 if shared else dv) > 384
    bh = block_h or (min(32 if wide else 64, _p2(r)))
    bn = block_n or (32 if wide else 64)
    return bh, bn, 8 if wide else 4


def _prep(q, kbuf, vbuf, idx):
    lq, hq, dqk = q.shape
    hk = kbuf.shape[1]
    dv = vbuf.shape[-1]
    if hq % hk:
        raise ValueError(f"index kernel: {hq} query heads are not a multiple of {hk} KV heads")
    for name, t in (("q", q), ("k", kbuf), ("v", vbuf)):
        if t.stride(-1) != 1:
            raise ValueError(f"index kernel: {name}'s last dim must be contiguous (stride {t.stride()})")
    shared = _shared(kbuf, vbuf)
    da = dv if shared else dqk
    return lq, hq, hk, dqk, dv, shared, da, dqk - da, idx.contiguous()


def index_forward(q, kbuf, vbuf, idx, scale, block_h=None, block_n=None):
    """As _kernels.index_forward: q [lq, hq, dqk] (any strides, last dim contiguous), kbuf [Lk, hk, dqk],
    vbuf [Lk, hk, dv] (a view of kbuf's first d_v columns for a shared latent), idx [lq, w] (-1: padding)
    -> O fp32 [lq, hq, dv], lse fp32 [lq, hq]."""
    lq, hq, hk, dqk, dv, shared, da, db, idx = _prep(q, kbuf, vbuf, idx)
    r = hq // hk
    w = idx.shape[1]
    o = torch.zeros((lq, hq, dv), dtype=torch.float32, device=q.device)
    lse = torch.full((lq, hq), float("-inf"), dtype=torch.float32, device=q.device)
    if lq == 0 or w == 0:
        return o, lse
    fwd, _ = _build()
    bh, bn, nw = config(r, dqk, dv, shared, block_h, block_n)
    interp = _interpreting()
    prec = "ieee" if q.dtype == torch.float32 else "tf32"  # fp32 scores without TF32; ignored for half types
    opts = {} if interp else {"num_warps": nw}
    grid = (lq, hk, -(-r // bh))
    LAUNCHES["fwd"] += 1
    with _launching(interp):
        fwd[grid](q, kbuf, vbuf, idx, o, lse, w, r, q.stride(0), q.stride(1), kbuf.stride(0), kbuf.stride(1),
                  vbuf.stride(0), vbuf.stride(1), idx.stride(0), o.stride(0), o.stride(1), lse.stride(0),
                  float(scale) * LOG2E, DA=da, DB=db, DV=dv, BDA=_p2(da), BDB=_p2(db) if db else 16, BDV=_p2(dv),
                  SHARED=shared, BLOCK_H=bh, BLOCK_N=bn, UPCAST=interp, PREC=prec, **opts)
    return o, lse


def index_backward(q, kbuf, vbuf, do, lse, delta, idx, scale, dq, dkbuf, dvbuf, block_h=None, block_n=None):
    """As _kernels.index_backward: adds the arg's gradients into dq [lq, hq, dqk] and the k-buffer
    accumulators dkbuf [Lk, hk, dqk], dvbuf [Lk, hk, dv] (fp32; dvbuf a view of dkbuf's first d_v columns for
    a shared latent). do [lq, hq, dv]; lse and delta [lq, hq]: the final ones of each row."""
    lq, hq, hk, dqk, dv, shared, da, db, idx = _prep(q, kbuf, vbuf, idx)
    r = hq // hk
    w = idx.shape[1]
    if lq == 0 or w == 0:
        return
    for name, t in (("dq", dq), ("dk", dkbuf), ("dv", dvbuf)):
        if t.dtype != torch.float32 or t.stride(-1) != 1:
            raise ValueError(f"index kernel: {name} must be an fp32 accumulator with a contiguous last dim")
    if shared != _shared(dkbuf, dvbuf):
        raise ValueError("index kernel: dV must be a view of dK's first d_v columns exactly when V is K's")
    _, bwd = _build()
    bh, bn, nw = config(r, dqk, dv, shared, block_h, block_n)
    interp = _interpreting()
    do = do if do.stride(-1) == 1 else do.contiguous()
    lse = lse.float()
    delta = delta.float()
    prec = "ieee" if q.dtype == torch.float32 else "tf32"
    opts = {} if interp else {"num_warps": nw}
    grid = (lq, hk, -(-r // bh))
    LAUNCHES["bwd"] += 1
    with _launching(interp):
        bwd[grid](q, kbuf, vbuf, do, lse, delta, idx, dq, dkbuf, dvbuf, w, r, q.stride(0), q.stride(1),
                  kbuf.stride(0), kbuf.stride(1), vbuf.stride(0), vbuf.stride(1), do.stride(0), do.stride(1),
                  lse.stride(0), delta.stride(0), idx.stride(0), dq.stride(0), dq.stride(1), dkbuf.stride(0),
                  dkbuf.stride(1), dvbuf.stride(0), dvbuf.stride(1), float(scale), float(scale) * LOG2E,
                  DA=da, DB=db, DV=dv, BDA=_p2(da), BDB=_p2(db) if db else 16, BDV=_p2(dv), SHARED=shared,
                  BLOCK_H=bh, BLOCK_N=bn, UPCAST=interp, PREC=prec, **opts)


def index_flops(pairs, hq, dqk, dv):
    """Forward FLOPs of an index arg with `pairs` selected (query, key) pairs: 2 hq (dqk + dv) each."""
    return 2.0 * pairs * hq * (dqk + dv)
