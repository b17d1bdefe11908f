"""A stage's range args batched into varlen FlashAttention-2 calls: what the `flash` (flash-attn) and `aten`
(PyTorch's own FA2 ops) backends share. Only the kernel calls differ between them.

FA2's masks are per call and aligned bottom-right per sequence (flash-attn's and PyTorch's semantics): with
Lq query and Lk key rows of a sequence, d = Lk - Lq, row i sees keys j with i + d - left <= j <= i + d + right
(a window; -1 is unbounded; causal is (-1, 0)). A plan arg (docs/plan_format.md, _kernels.py) maps to it:

    full        one sequence, no mask
    causal      causal (j <= i + d)
    inv_causal  causal on the arg's q rows and k rows both reversed: j >= i  <=>  j' <= i' + d with i' = Lq-1-i,
                j' = Lk-1-j, so the reversed arg joins the causal batch (the row indices that gather its
                inputs run backwards; the outputs and gradients go back through the same indices)
    bi_causal   the window (d, 0): i <= j <= i + d, one call per distinct d = Lk - Lq (a bi_causal arg with
                d < 0 sees no key and is skipped)

A row that sees no key of its sequence gets O = 0 and LSE = +inf from FA2 (e.g. causal with Lk < Lq); the
merge reads an LSE of +inf as "no contribution" (it becomes -inf before any merge).
"""
from __future__ import annotations

import numpy as np
import torch

from ._kernels import TorchBackend, scatter_merge

NEG_INF = float("-inf")


def arg_mode(a):
    """(batch key, reversed) of a range arg FA2 computes, or None: key 'full', 'causal' or ('window', d)."""
    if a.index_width > 0 or a.q1 <= a.q0 or a.k1 <= a.k0:
        return None
    if a.type == 0:
        return "full", False
    if a.type == 1:
        return "causal", False
    if a.type == 2:
        return "causal", True
    d = (a.k1 - a.k0) - (a.q1 - a.q0)
    return (("window", d), False) if d >= 0 else None


def _window(key):
    """(is_causal, window_left, window_right) of a batch key (-1: unbounded)."""
    if key == "full":
        return False, -1, -1
    if key == "causal":
        return True, -1, 0
    return False, key[1], 0


class VarlenBatch:
    """The args of one stage with one batch key and (q buffer, k buffer): one varlen call, each arg a sequence.
    Row indices (local rows flattened with their head group, or remote rows; reversed for inv_causal args)
    and cu_seqlens are built once per plan and device."""
    __slots__ = ("key", "causal", "window", "q_remote", "k_remote", "q_idx", "k_idx", "cu_q", "cu_k", "max_q",
                 "max_k")

    def __init__(self, key, args, G, device):
        a0 = args[0]
        self.key = key
        self.causal, wl, wr = _window(key)
        self.window = (wl, wr)
        self.q_remote, self.k_remote = a0.q_remote, a0.k_remote

        def rows(lo, hi, remote, group, rev):
            r = np.arange(hi - 1, lo - 1, -1, dtype=np.int64) if rev else np.arange(lo, hi, dtype=np.int64)
            return r if remote else r * G + max(group, 0)
        rev = [arg_mode(a)[1] for a in args]
        self.q_idx = torch.from_numpy(np.concatenate([rows(a.q0, a.q1, a.q_remote, a.group, r)
                                                      for a, r in zip(args, rev)])).to(device)
        self.k_idx = torch.from_numpy(np.concatenate([rows(a.k0, a.k1, a.k_remote, a.group, r)
                                                      for a, r in zip(args, rev)])).to(device)
        lq = [a.q1 - a.q0 for a in args]
        lk = [a.k1 - a.k0 for a in args]
        self.cu_q = torch.tensor([0] + lq, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
        self.cu_k = torch.tensor([0] + lk, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
        self.max_q, self.max_k = max(lq), max(lk)


def _side(batches, remote, attr):
    """Rows of buffer `remote` that the batches read on one side (q_idx or k_idx), concatenated, and each
    reading batch's range in them."""
    mine = [x for x in batches if getattr(x, attr[0]) == remote]
    if not mine:
        return None
    idxs = [getattr(x, attr[1]) for x in mine]
    at, ranges = 0, {}
    for x, i in zip(mine, idxs):
        ranges[id(x)] = (at, at + i.numel())
        at += i.numel()
    return torch.cat(idxs) if len(idxs) > 1 else idxs[0], ranges


class VarlenStage:
    """A stage's args split for a varlen backend, built once per plan and device: its batches, the args left
    to the torch kernels (index args, empty ones), and per side (q, k) and buffer (local, remote) the rows the
    batches read, so that a stage gathers each field of a buffer with one index_select into a buffer of the
    stage (`io`) whose rows are the batches' inputs, and adds each gradient back with one index_add (or hands
    it to the executor)."""
    __slots__ = ("batches", "rest", "q_side", "k_side", "merge")

    def __init__(self, args, G, qpg, device):
        groups, self.rest = {}, []
        for a in args:
            m = arg_mode(a)
            if m is None:
                self.rest.append(a)
            else:
                groups.setdefault((m[0], a.q_remote, a.k_remote), []).append(a)
        self.batches = [VarlenBatch(key[0], batch, G, device) for key, batch in groups.items()]
        self.q_side = {r: x for r in (False, True) if (x := _side(self.batches, r, ("q_remote", "q_idx"))) is not None}
        self.k_side = {r: x for r in (False, True) if (x := _side(self.batches, r, ("k_remote", "k_idx"))) is not None}
        rq = self.q_side.get(True)
        self.merge = None if rq is None else (rq[0], rq[0].view(-1, 1, 1).expand(-1, qpg, 1).contiguous())

    def buffers(self, pass_, b, grads_in_place):
        """The stage's gathered inputs (and, backward, the kernels' gradient outputs when the kernel writes
        them in place) for this pass and dtype: per buffer and field one tensor, per batch its views. They live
        in the device's shared workspace (`b.take`: the same offsets every call of the plan, nothing kept
        between calls) and are the stage's own until its gradients are added (the executor adds local
        gradients at the end of the pass)."""
        dt = b.remote_k.dtype
        dqk, dv = b.remote_q.shape[-1], b.remote_v.shape[-1]
        if pass_ == "fwd":
            qf = [("q", dt, (b.q_per_group, dqk))]
            kf = [("k", dt, (b.kv_per_group, dqk)), ("v", dt, (b.kv_per_group, dv))]
        else:
            qf = [("q", dt, (b.q_per_group, dqk)), ("o", dt, (b.q_per_group, dv)), ("do", dt, (b.q_per_group, dv)),
                  ("lse", torch.float32, (b.q_per_group,))]
            kf = [("k", dt, (b.kv_per_group, dqk)), ("v", dt, (b.kv_per_group, dv))]
            if grads_in_place:
                qf.append(("dq", dt, (b.q_per_group, dqk)))
                kf += [("dk", dt, (b.kv_per_group, dqk)), ("dv", dt, (b.kv_per_group, dv))]
        names, specs = [], []
        for side, fields, rows in (("q", qf, self.q_side), ("k", kf, self.k_side)):
            for remote, (idx, _) in rows.items():
                for name, t, tail in fields:
                    names.append((side, remote, name))
                    specs.append(((idx.numel(),) + tail, t))

        def build(tensors):
            io = {"q": {}, "k": {}}
            for (side, remote, name), t in zip(names, tensors):
                io[side].setdefault(remote, {})[name] = t
            views = []
            for x in self.batches:
                v = {}
                for side, rows, rem in (("q", self.q_side, x.q_remote), ("k", self.k_side, x.k_remote)):
                    lo, hi = rows[rem][1][id(x)]
                    v.update({name: t[lo:hi] for name, t in io[side][rem].items()})
                views.append(v)
            return io, views
        return b.take((id(self), pass_, dt, b.q_per_group, b.kv_per_group, dqk, dv, grads_in_place), specs, build)


class VarlenBackend(TorchBackend):
    """The range args of a stage batched per (batch key, q buffer, k buffer) into one varlen FA2 call each
    (module text): a stage gathers each field of each buffer its batches read with one index_select (rows
    cached on the plan) into a buffer of the stage whose rows are the batches' inputs. Forward outputs of
    remote rows are merged into the accumulators with one lse-weighted scatter per stage; those of local rows
    are handed to the executor, which merges them with the returned partials in one scatter at the end of the
    pass. The backward calls the varlen backward per batch with the *final* O and lse of the rows (the merged
    ones), which is the exact gradient of each arg's share; each gradient is added back with one index_add per
    stage and buffer (local rows: by the executor, once per pass). Index args and args FA2 cannot express run
    on the torch kernels (`index="triton"`: index args on the Triton kernels).

    Subclasses give the kernels: `_fwd(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, window)` -> (O [n, H,
    d_v], lse [n, H] fp32; +inf or -inf for a row without keys), and `_bwd(do, q, k, v, o, lse_hn, cu_q, cu_k,
    max_q, max_k, scale, causal, window, dq, dk, dv)` -> (dq, dk, dv) with lse_hn [H, n] contiguous; a kernel
    that writes dq, dk, dv into the given buffers sets `grads_in_place` (else they are None and it returns
    its own)."""

    name = "varlen"
    grads_in_place = True

    def _split(self, args, b):
        device = b.q.device
        key = f"_varlen_{self.name}_{device}"
        hit = getattr(args, key, None) if hasattr(args, "__dict__") else None
        if hit is not None:
            return hit
        with torch.inference_mode(False):  # kept on the plan: ordinary tensors
            out = VarlenStage(args, b.q.shape[1] // b.q_per_group, b.q_per_group, device)
        if hasattr(args, "__dict__"):
            setattr(args, key, out)
        return out

    def forward_stage(self, args, b):
        st = self._split(args, b)
        if st.rest:
            super().forward_stage(st.rest, b)
        if not st.batches:
            return
        io, views = st.buffers("fwd", b, self.grads_in_place)
        for remote, (idx, _) in st.q_side.items():
            torch.index_select(b.remote_q if remote else b.flat("q"), 0, idx, out=io["q"][remote]["q"])
        for remote, (idx, _) in st.k_side.items():
            t = io["k"][remote]
            torch.index_select(b.remote_k if remote else b.flat("k"), 0, idx, out=t["k"])
            torch.index_select(b.remote_v if remote else b.flat("v"), 0, idx, out=t["v"])
        remote_parts = []
        for x, v in zip(st.batches, views):
            o, lse = self._fwd(v["q"], v["k"], v["v"], x.cu_q, x.cu_k, x.max_q, x.max_k, b.scale, x.causal, x.window)
            # FA2's +inf (a row that saw no key) is "no contribution": -inf for the merge
            lse = lse.nan_to_num(nan=float("nan"), posinf=NEG_INF, neginf=NEG_INF)
            if x.q_remote:
                remote_parts.append((o, lse))
            else:  # merged with the pass's other partials of local rows at its end
                b.merge_local(o, lse, x.q_idx)
        if remote_parts:  # the order of the batches reading remote rows: that of the merge's rows
            idx, exp = st.merge
            o = torch.cat([p[0] for p in remote_parts]) if len(remote_parts) > 1 else remote_parts[0][0]
            lse = torch.cat([p[1] for p in remote_parts]) if len(remote_parts) > 1 else remote_parts[0][1]
            scatter_merge(b.remote_o, b.remote_lse_rows, idx, o, lse.unsqueeze(-1), exp)

    def backward_stage(self, args, b):
        st = self._split(args, b)
        if st.rest:
            super().backward_stage(st.rest, b)
        if not st.batches:
            return
        io, views = st.buffers("bwd", b, self.grads_in_place)
        for remote, (idx, _) in st.q_side.items():
            t = io["q"][remote]
            srcs = (b.remote_q, b.remote_out, b.remote_dout, b.remote_lse) if remote else \
                (b.flat("q"), b.flat("out"), b.flat("dout"), b.flat("lse"))
            for name, src in zip(("q", "o", "do", "lse"), srcs):
                torch.index_select(src, 0, idx, out=t[name])
        for remote, (idx, _) in st.k_side.items():
            t = io["k"][remote]
            torch.index_select(b.remote_k if remote else b.flat("k"), 0, idx, out=t["k"])
            torch.index_select(b.remote_v if remote else b.flat("v"), 0, idx, out=t["v"])
        grads = []
        for x, v in zip(st.batches, views):
            lse_hn = v["lse"].transpose(0, 1).contiguous()  # [heads, total_q], as FA2 keeps it
            grads.append(self._bwd(v["do"], v["q"], v["k"], v["v"], v["o"], lse_hn, x.cu_q, x.cu_k, x.max_q,
                                   x.max_k, b.scale, x.causal, x.window, v.get("dq"), v.get("dk"), v.get("dv")))
        cdt = b.remote_dq.dtype
        for side, rows, names, acc in (("q", st.q_side, ("dq",), (b.remote_dq,)), ("k", st.k_side, ("dk", "dv"),
                                                                              (b.remote_dk, b.remote_dv))):
            for remote, (idx, ranges) in rows.items():
                for j, (name, a) in enumerate(zip(names, acc)):
                    if self.grads_in_place:
                        g = io[side][remote][name]
                    else:  # the kernels' own outputs, in the side's row order
                        pos = 0 if side == "q" else 1 + j
                        mine = [gr[pos] for x, gr in zip(st.batches, grads) if id(x) in ranges]
                        g = torch.cat(mine) if len(mine) > 1 else mine[0]
                    if remote:
                        a.index_add_(0, idx, g.to(cdt))
                    else:  # added with the pass's other gradients of local rows at its end
                        b.add_local(name, g, idx)

    def _fwd(self, q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, window):
        raise NotImplementedError

    def _bwd(self, do, q, k, v, o, lse_hn, cu_q, cu_k, max_q, max_k, scale, causal, window, dq, dk, dv):
        raise NotImplementedError
