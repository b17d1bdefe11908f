"""Attention kernels for one plan arg, in pure torch, and the stage backends built on them.

A range arg computes rows `q` of its q buffer against rows `k` of its k buffer under a mask type anchored to
that rectangle (core/include/cpsched/mask.hpp, runtimes/sim/row_span.hpp): with i, j relative to the
rectangle, lq x lk, d = lk - lq,

    full        every (i, j)
    causal      j <= i + d          (bottom-right aligned)
    inv_causal  j >= i              (top-left aligned)
    bi_causal   i <= j <= i + d

Every kernel returns O (fp32) and lse (natural log, fp32; -inf and O = 0 for a row with no unmasked entry),
and its backward recomputes P from the *final* lse of the row: dS = P (dP - delta), delta = rowsum(dO O) of
the final O, exactly as runtimes/sim/attention_kernel.cpp does, so partial results of many args merge into
the exact attention of the whole mask.
"""
from __future__ import annotations

import torch

NEG_INF = float("-inf")
# Elements of the fp32 score matrix one chunk may hold (64 MiB): memory stays bounded for any arg size.
SCORE_BUDGET = 1 << 24


def compute_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def col_hull(mtype, i0, i1, lq, lk):
    """Columns [c0, c1) touched by relative rows [i0, i1) of a slice (rows' spans are monotone)."""
    d = lk - lq
    if mtype == 0:
        return 0, lk
    if mtype == 1:
        return 0, max(0, min(lk, i1 - 1 + d + 1))
    if mtype == 2:
        return min(i0, lk), lk
    return min(i0, lk), max(min(i0, lk), min(lk, i1 - 1 + d + 1))


def chunk_mask(mtype, i0, i1, c0, c1, lq, lk, device):
    """Boolean [i1 - i0, c1 - c0] of the unmasked entries of rows [i0, i1) x cols [c0, c1); None = all."""
    if mtype == 0:
        return None
    d = lk - lq
    i = torch.arange(i0, i1, device=device).unsqueeze(1)
    j = torch.arange(c0, c1, device=device).unsqueeze(0)
    if mtype == 1:
        return j <= i + d
    if mtype == 2:
        return j >= i
    return (j >= i) & (j <= i + d)


def _rows_per_chunk(lq, heads, width):
    return max(1, min(lq, SCORE_BUDGET // max(1, heads * width)))


def _range_chunks(mtype, lq, hq, lk):
    """(i0, i1, c0, c1): the chunks of query rows of a range arg with their key-column hull, skipping a
    chunk that sees no key."""
    step = _rows_per_chunk(lq, hq, lk)
    for i0 in range(0, lq, step):
        i1 = min(lq, i0 + step)
        c0, c1 = col_hull(mtype, i0, i1, lq, lk)
        if c1 > c0:
            yield i0, i1, c0, c1


def _by_kv_head(x, hk, r):
    """Rows [n, hk * r, ...] -> [hk, r * n, ...]: each KV head's query heads as one batch of rows."""
    n = x.shape[0]
    rest = x.shape[2:]
    return x.reshape(n, hk, r, *rest).permute(1, 2, 0, *range(3, 3 + len(rest))).reshape(hk, r * n, *rest)


def range_forward(q, k, v, mtype, scale):
    """q [lq, hq, dqk], k [lk, hk, dqk], v [lk, hk, dv] -> O [lq, hq, dv], lse [lq, hq] (fp32 or fp64)."""
    lq, hq, dqk = q.shape
    lk, hk, _ = k.shape
    dv = v.shape[-1]
    r = hq // hk
    cdt = compute_dtype(q.dtype)
    o = torch.zeros((lq, hq, dv), dtype=cdt, device=q.device)
    lse = torch.full((lq, hq), NEG_INF, dtype=cdt, device=q.device)
    if lq == 0 or lk == 0:
        return o, lse
    kh = k.to(cdt).permute(1, 0, 2)
    vh = v.to(cdt).permute(1, 0, 2)
    for i0, i1, c0, c1 in _range_chunks(mtype, lq, hq, lk):
        n = i1 - i0
        qc = _by_kv_head(q[i0:i1].to(cdt), hk, r)
        s = torch.matmul(qc, kh[:, c0:c1].transpose(1, 2)).mul_(scale).view(hk, r, n, c1 - c0)
        m = chunk_mask(mtype, i0, i1, c0, c1, lq, lk, q.device)
        if m is not None:
            s.masked_fill_(~m, NEG_INF)
        s = s.view(hk, r * n, c1 - c0)
        lc = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - torch.where(torch.isinf(lc), torch.zeros_like(lc), lc).unsqueeze(-1))
        oc = torch.matmul(p, vh[:, c0:c1])
        o[i0:i1] = oc.view(hk, r, n, dv).permute(2, 0, 1, 3).reshape(n, hq, dv)
        lse[i0:i1] = lc.view(hk, r, n).permute(2, 0, 1).reshape(n, hq)
    return o, lse


def range_backward(q, k, v, do, lse, delta, mtype, scale, dq, dk, dv):
    """Adds the arg's gradients into dq [lq, hq, dqk], dk [lk, hk, dqk] and dv [lk, hk, dv] (fp32 views of
    the accumulators). do [lq, hq, dv]; lse and delta [lq, hq]: the final ones of each row."""
    lq, hq, dqk = q.shape
    lk, hk, _ = k.shape
    dvd = v.shape[-1]
    r = hq // hk
    if lq == 0 or lk == 0:
        return
    cdt = dq.dtype
    kh = k.to(cdt).permute(1, 0, 2)
    vh = v.to(cdt).permute(1, 0, 2)
    dkh = torch.zeros((hk, lk, dqk), dtype=cdt, device=q.device)
    dvh = torch.zeros((hk, lk, dvd), dtype=cdt, device=q.device)
    for i0, i1, c0, c1 in _range_chunks(mtype, lq, hq, lk):
        n = i1 - i0
        qc = _by_kv_head(q[i0:i1].to(cdt), hk, r)
        doc = _by_kv_head(do[i0:i1].to(cdt), hk, r)
        lc = _by_kv_head(lse[i0:i1].to(cdt), hk, r).unsqueeze(-1)
        dc = _by_kv_head(delta[i0:i1].to(cdt), hk, r).unsqueeze(-1)
        s = torch.matmul(qc, kh[:, c0:c1].transpose(1, 2)).mul_(scale)
        p = torch.exp(s - torch.where(torch.isinf(lc), torch.zeros_like(lc), lc))
        m = chunk_mask(mtype, i0, i1, c0, c1, lq, lk, q.device)
        if m is not None:
            p = p.view(hk, r, n, c1 - c0).masked_fill_(~m, 0.0).view(hk, r * n, c1 - c0)
        p = torch.where(torch.isinf(lc), torch.zeros_like(p), p)  # a row with no entry anywhere
        dvh[:, c0:c1] += torch.matmul(p.transpose(1, 2), doc)
        ds = p * (torch.matmul(doc, vh[:, c0:c1].transpose(1, 2)) - dc)
        dqc = torch.matmul(ds, kh[:, c0:c1]).mul_(scale)
        dq[i0:i1] += dqc.view(hk, r, n, dqk).permute(2, 0, 1, 3).reshape(n, hq, dqk)
        dkh[:, c0:c1] += torch.matmul(ds.transpose(1, 2), qc).mul_(scale)
    dk += dkh.permute(1, 0, 2)
    dv += dvh.permute(1, 0, 2)


def index_forward(q, kbuf, vbuf, idx, scale):
    """Gather-based kernel of an index arg: query row i of q [lq, hq, dqk] attends to the rows idx[i, :] of
    kbuf [Lk, hk, dqk] / vbuf [Lk, hk, dv] (-1: padding). -> O [lq, hq, dv], lse [lq, hq]."""
    lq, hq, dqk = q.shape
    hk = kbuf.shape[1]
    dv = vbuf.shape[-1]
    r = hq // hk
    w = idx.shape[1]
    cdt = compute_dtype(q.dtype)
    o = torch.zeros((lq, hq, dv), dtype=cdt, device=q.device)
    lse = torch.full((lq, hq), NEG_INF, dtype=cdt, device=q.device)
    if lq == 0 or w == 0:
        return o, lse
    step = _rows_per_chunk(lq, hk, w * (dqk + dv) + hq * w)
    for i0 in range(0, lq, step):
        i1 = min(lq, i0 + step)
        n = i1 - i0
        ic = idx[i0:i1]
        valid = ic >= 0
        ic = ic.clamp_min(0)
        kk = kbuf[ic].to(cdt)  # [n, w, hk, dqk]
        vv = vbuf[ic].to(cdt)
        qq = q[i0:i1].to(cdt).reshape(n, hk, r, dqk)
        s = torch.einsum("ngrd,nwgd->ngrw", qq, kk).mul_(scale)
        s.masked_fill_(~valid[:, None, None, :], NEG_INF)
        lc = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - torch.where(torch.isinf(lc), torch.zeros_like(lc), lc).unsqueeze(-1))
        o[i0:i1] = torch.einsum("ngrw,nwgv->ngrv", p, vv).reshape(n, hq, dv)
        lse[i0:i1] = lc.reshape(n, hq)
    return o, lse


def index_backward(q, kbuf, vbuf, do, lse, delta, idx, scale, dq, dkbuf, dvbuf):
    """Adds an index arg's gradients into dq [lq, hq, dqk] and the k-buffer accumulators dkbuf, dvbuf."""
    lq, hq, dqk = q.shape
    hk = kbuf.shape[1]
    dv = vbuf.shape[-1]
    r = hq // hk
    w = idx.shape[1]
    if lq == 0 or w == 0:
        return
    cdt = dq.dtype
    step = _rows_per_chunk(lq, hk, w * (dqk + dv) + hq * w)
    for i0 in range(0, lq, step):
        i1 = min(lq, i0 + step)
        n = i1 - i0
        ic = idx[i0:i1]
        valid = ic >= 0
        ic = ic.clamp_min(0)
        kk = kbuf[ic].to(cdt)
        vv = vbuf[ic].to(cdt)
        qq = q[i0:i1].to(cdt).reshape(n, hk, r, dqk)
        dd = do[i0:i1].to(cdt).reshape(n, hk, r, dv)
        lc = lse[i0:i1].to(cdt).reshape(n, hk, r, 1)
        dc = delta[i0:i1].to(cdt).reshape(n, hk, r, 1)
        s = torch.einsum("ngrd,nwgd->ngrw", qq, kk).mul_(scale)
        p = torch.exp(s - torch.where(torch.isinf(lc), torch.zeros_like(lc), lc))
        p = p.masked_fill(~valid[:, None, None, :] | torch.isinf(lc), 0.0)
        ds = p * (torch.einsum("ngrv,nwgv->ngrw", dd, vv) - dc)
        dq[i0:i1] += torch.einsum("ngrw,nwgd->ngrd", ds, kk).mul_(scale).reshape(n, hq, dqk)
        flat = ic.reshape(-1)
        dkbuf.index_add_(0, flat, torch.einsum("ngrw,ngrd->nwgd", ds, qq).mul_(scale).reshape(n * w, hk, dqk))
        dvbuf.index_add_(0, flat, torch.einsum("ngrw,ngrv->nwgv", p, dd).reshape(n * w, hk, dv))


def merge_into(o_acc, lse_acc, o, lse):
    """lse-weighted merge of a partial result into accumulator views (fp32): lse = log(e^a + e^b),
    O = e^(a - lse) O_a + e^(b - lse) O_b; a row that is -inf in both stays O = 0, lse = -inf."""
    m = torch.maximum(lse_acc, lse)
    ms = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    wa = torch.exp(lse_acc - ms)
    wb = torch.exp(lse - ms)
    den = wa + wb
    o_acc.copy_((o_acc * wa.unsqueeze(-1) + o * wb.unsqueeze(-1)) / den.clamp_min(1e-38).unsqueeze(-1))
    lse_acc.copy_(ms + torch.log(den))


def scatter_merge(o_acc, lse_acc, idx, o, lse, idx_exp=None):
    """Merges partial rows (o [n, H, dv], lse [n, H]) into accumulator rows idx (o_acc [M, H, dv],
    lse_acc [M, H]); rows of idx may repeat (a row cast to several ranks comes back from each). The lse
    tensors may also come with a trailing 1 ([M, H, 1], [n, H, 1]) and `idx_exp` be idx expanded to lse's
    shape: callers that merge the same rows every call keep those views and save their ops. o may be of a
    lower precision than o_acc (it is weighted in o_acc's dtype)."""
    if idx.numel() == 0:
        return
    if lse_acc.dim() < o_acc.dim():
        lse_acc, lse, idx_exp = lse_acc.unsqueeze(-1), lse.unsqueeze(-1), None
    if lse.dtype != lse_acc.dtype:
        lse = lse.to(lse_acc.dtype)
    if idx_exp is None:
        idx_exp = idx.view(-1, *([1] * (lse.dim() - 1))).expand_as(lse)
    m = lse_acc.scatter_reduce(0, idx_exp, lse, "amax", include_self=True)
    # a row that is -inf everywhere gets a finite shift: its weights stay exp(-inf) = 0, O = 0, lse = -inf
    m.clamp_(min=torch.finfo(m.dtype).min)
    wa = torch.sub(lse_acc, m).exp_()
    wb = torch.sub(lse, m.index_select(0, idx)).exp_()
    den = wa.index_add(0, idx, wb)
    o_acc.mul_(wa)
    o_acc.index_add_(0, idx, o * wb)
    o_acc.div_(den.clamp_min(1e-38))
    torch.add(m, den.log_(), out=lse_acc)


# ---- stage backends ----------------------------------------------------------------------------


class StageBuffers:
    """What a stage's args read and write, one pass's (ForwardBuffers, BackwardBuffers): the call's inputs and
    the workspace's views. Local tensors hold every head of the rank's rows; remote ones (`remote_*`, the rows
    the casts brought) the heads of one head group per row. Accumulators are fp32 (fp64 for fp64 inputs).

    Batched backends address rows flattened with their head group ([rows * G, heads per group, ...]): `flat`
    gives this call's local tensors so (one view per call, none when G = 1). `take(key, [(shape, dtype),
    ...])` gives a backend scratch tensors in the device's shared workspace, the same ones for `key` every call
    of the plan (they hold nothing between calls)."""
    __slots__ = ("q", "k", "v", "remote_q", "remote_k", "remote_v", "indices", "q_per_group", "kv_per_group",
                 "scale", "shared", "take", "_flat")

    def __init__(self, q=None, k=None, v=None, remote_q=None, remote_k=None, remote_v=None, indices=None,
                 q_per_group=None, kv_per_group=None, scale=None, shared=False, take=None):
        self.q, self.k, self.v = q, k, v
        self.remote_q, self.remote_k, self.remote_v = remote_q, remote_k, remote_v
        self.indices = indices  # the pass's index pool (index args)
        self.q_per_group, self.kv_per_group = q_per_group, kv_per_group  # heads of a head group
        self.scale, self.shared, self.take = scale, shared, take
        self._flat = {}

    def release(self, *names):
        """Drops the call's tensors (`names`) and what was derived from them once its pass is over: the
        workspace must not keep a call's activations alive, nor hold (through a saved output's grad_fn) the
        autograd node that holds the plan."""
        for n in names:
            setattr(self, n, None)
        self._flat.clear()
        self._release_parts()

    def _release_parts(self):
        pass

    def flat(self, name):
        """This call's local `name` ('q', 'k', 'v', 'out', 'dout', 'lse') as [rows * G, heads per group, ...]."""
        t = self._flat.get(name)
        if t is None:
            x = getattr(self, name)
            per = self.kv_per_group if name in ("k", "v") else self.q_per_group
            if x.shape[1] != per:
                sh = (x.shape[0] * (x.shape[1] // per), per, *x.shape[2:])
                x = x.view(sh) if x.is_contiguous() else x.reshape(sh)
            t = x
            self._flat[name] = t
        return t


class ForwardBuffers(StageBuffers):
    """The forward pass's: partial results O and lse of the local rows (`o`, `lse`) and of the remote ones
    (`remote_o`, `remote_lse`; `remote_lse_rows` is remote_lse with a trailing 1, as scatter_merge takes it).
    `merge_local` hands the executor partial results of local rows, which it merges with the returned ones at
    once at the end of the pass (one scatter per field, whatever the number of batches)."""
    __slots__ = ("o", "lse", "remote_o", "remote_lse", "remote_lse_rows", "local_parts")

    def __init__(self, o=None, lse=None, remote_o=None, remote_lse=None, remote_lse_rows=None, **common):
        super().__init__(**common)
        self.o, self.lse, self.remote_o, self.remote_lse = o, lse, remote_o, remote_lse
        self.remote_lse_rows = remote_lse_rows
        self.local_parts = []

    def _release_parts(self):
        self.local_parts.clear()

    def merge_local(self, o, lse, idx):
        """A partial result (o [n, heads per group, dv], lse [n, heads per group]) of local rows idx (flattened
        with their group), merged by the executor with every other at the end of the forward pass."""
        self.local_parts.append((o, lse, idx))


class BackwardBuffers(StageBuffers):
    """The backward pass's: the final O, lse and dO of the local rows (`out`, `lse`, `dout`) and of the remote
    ones (`remote_out`, `remote_lse`, `remote_dout`), and the gradients of both (`dq`, `dk`, `dv`,
    `remote_dq`, ...). `delta` (rowsum(dO O) of the local rows) and `remote_delta` (of the remote rows) are
    computed on first read: a backend that never reads them (flash computes its own, `none` nothing) costs no
    ops for them. The executor queues each stage's remote rows with `defer_remote_delta` once they have
    arrived. `add_local` hands the executor gradients of local rows, added with the returned ones at once at
    the end of the pass."""
    __slots__ = ("lse", "out", "dout", "remote_lse", "remote_out", "remote_dout", "dq", "dk", "dv", "remote_dq",
                 "remote_dk", "remote_dv", "local_grads", "_delta", "_remote_delta", "_remote_delta_todo")

    def __init__(self, lse=None, out=None, dout=None, remote_lse=None, remote_out=None, remote_dout=None, dq=None,
                 dk=None, dv=None, remote_dq=None, remote_dk=None, remote_dv=None, delta=None, remote_delta=None,
                 **common):
        super().__init__(**common)
        self.lse, self.out, self.dout = lse, out, dout
        self.remote_lse, self.remote_out, self.remote_dout = remote_lse, remote_out, remote_dout
        self.dq, self.dk, self.dv = dq, dk, dv
        self.remote_dq, self.remote_dk, self.remote_dv = remote_dq, remote_dk, remote_dv
        self._delta, self._remote_delta, self._remote_delta_todo = delta, remote_delta, []
        self.local_grads = {"dq": [], "dk": [], "dv": []}

    def _release_parts(self):
        self._delta = None
        self._remote_delta_todo.clear()
        for g in self.local_grads.values():
            g.clear()

    @property
    def delta(self):
        if self._delta is None and self.dout is not None:
            self._delta = torch.sum(self.dout.to(compute_dtype(self.dout.dtype)) * self.out, -1)
        return self._delta

    @delta.setter
    def delta(self, x):
        self._delta = x

    @property
    def remote_delta(self):
        todo = self._remote_delta_todo
        if todo:
            for d, do, o in todo:  # views of remote_delta, remote_dout and remote_out over one stage's rows
                torch.sum(do.to(d.dtype) * o, -1, out=d)
            todo.clear()
        return self._remote_delta

    def defer_remote_delta(self, d, do, o):
        self._remote_delta_todo.append((d, do, o))

    def add_local(self, name, grad, idx):
        """A gradient ('dq', 'dk' or 'dv'; [n, heads per group, d], any float dtype) of local rows idx, added
        by the executor with every other at the end of the backward pass. `grad` must stay unchanged until
        then (the pass's own buffer)."""
        self.local_grads[name].append((grad, idx))


def _heads(a, per_group):
    if a.group < 0:
        return slice(None)
    return slice(a.group * per_group, (a.group + 1) * per_group)


class TorchBackend:
    """The reference: one pure-torch kernel call per arg (range args: masked scores, fp32 softmax with lse,
    chunked; index args: the gather kernel), partial results merged by lse in fp32. CPU and GPU.
    `index="triton"`: index args on the Triton kernels (_triton.py) instead of the gather kernel."""

    name = "torch"
    index = "torch"

    def __init__(self, index="torch"):
        if index not in ("torch", "triton"):
            raise ValueError(f"index: expected 'torch' or 'triton', got {index!r}")
        self.index = index

    def graph_key(self):
        """What a captured pass of this backend depends on (_graphs.py)."""
        return (type(self).__qualname__, self.index)

    def _index_kernels(self):
        if self.index == "triton":
            from ._triton import index_backward as ib, index_forward as ifw
            return ifw, ib
        return index_forward, index_backward

    def forward_stage(self, args, b):
        for a in args:
            qh = _heads(a, b.q_per_group)
            kh = _heads(a, b.kv_per_group)
            qv = b.remote_q[a.q0:a.q1] if a.q_remote else b.q[a.q0:a.q1, qh]
            if a.index_width > 0:
                kbuf = b.remote_k if a.k_remote else b.k[:, kh]
                vbuf = b.remote_v if a.k_remote else b.v[:, kh]
                idx = b.indices[a.index_offset:a.index_offset + (a.q1 - a.q0) * a.index_width]
                o, lse = self._index_kernels()[0](qv, kbuf, vbuf, idx.view(a.q1 - a.q0, a.index_width), b.scale)
            else:
                kv_ = b.remote_k[a.k0:a.k1] if a.k_remote else b.k[a.k0:a.k1, kh]
                vv_ = b.remote_v[a.k0:a.k1] if a.k_remote else b.v[a.k0:a.k1, kh]
                o, lse = range_forward(qv, kv_, vv_, a.type, b.scale)
            if a.q_remote:
                merge_into(b.remote_o[a.q0:a.q1], b.remote_lse[a.q0:a.q1], o, lse)
            else:
                merge_into(b.o[a.q0:a.q1, qh], b.lse[a.q0:a.q1, qh], o, lse)

    def backward_stage(self, args, b):
        for a in args:
            qh = _heads(a, b.q_per_group)
            kh = _heads(a, b.kv_per_group)
            if a.q_remote:
                sl = slice(a.q0, a.q1)
                qv, dov, lsev = b.remote_q[sl], b.remote_dout[sl], b.remote_lse[sl]
                dlt, dqv = b.remote_delta[sl], b.remote_dq[sl]
            else:
                sl = slice(a.q0, a.q1)
                qv, dov, lsev, dlt, dqv = b.q[sl, qh], b.dout[sl, qh], b.lse[sl, qh], b.delta[sl, qh], b.dq[sl, qh]
            if a.k_remote:
                kbuf, vbuf, dkbuf = b.remote_k, b.remote_v, b.remote_dk
                dvbuf = b.remote_dk[..., :b.remote_v.shape[-1]] if b.shared else b.remote_dv
            else:
                kbuf, vbuf, dkbuf = b.k[:, kh], b.v[:, kh], b.dk[:, kh]
                dvbuf = b.dk[:, kh, :b.v.shape[-1]] if b.shared else b.dv[:, kh]
            if a.index_width > 0:
                idx = b.indices[a.index_offset:a.index_offset + (a.q1 - a.q0) * a.index_width]
                self._index_kernels()[1](qv, kbuf, vbuf, dov, lsev, dlt, idx.view(a.q1 - a.q0, a.index_width),
                                         b.scale, dqv, dkbuf, dvbuf)
            else:
                ks = slice(a.k0, a.k1)
                range_backward(qv, kbuf[ks], vbuf[ks], dov, lsev, dlt, a.type, b.scale, dqv, dkbuf[ks], dvbuf[ks])


class NullBackend:
    """Computes nothing: the executor's own host-side cost (benchmarks, byte accounting)."""

    name = "none"

    def graph_key(self):
        return ("none",)

    def forward_stage(self, args, b):
        pass

    def backward_stage(self, args, b):
        pass

