"""Kernel backends beyond the torch reference: flash-attn's varlen kernels and FlexAttention, each built from
a stage's args, and the `auto` choice.

`flex` ran on one H200 (docs/torch.md, "On a GPU"); flash-attn's kernels have not run on a GPU here. `flex`'s
forward also runs on the CPU in eager mode and is tested there against the torch kernel. Both fall back to the
torch kernels for what they cannot express (flash: inv_causal / bi_causal args and index args; flex: the
backward on the CPU and index args).
"""
from __future__ import annotations

import collections
import functools
import threading

import torch

from ._kernels import TorchBackend, _heads, merge_into, scatter_merge


@functools.lru_cache(maxsize=None)
def flash_available():
    try:
        import flash_attn  # noqa: F401
        from flash_attn import flash_attn_varlen_func  # noqa: F401
        return True
    except Exception:  # ImportError, or a build for another CUDA / torch
        return False


@functools.lru_cache(maxsize=None)
def flex_available():
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
        return True
    except Exception:
        return False


class _FlashBatch:
    """Full or causal range args of one stage with the same mask type and buffers: one varlen sequence each.
    Row indices (local rows flattened with their head group, or remote rows) and cu_seqlens are built once
    per plan and device and cached on the plan's arg list."""
    __slots__ = ("causal", "q_remote", "k_remote", "q_idx", "k_idx", "cu_q", "cu_k", "max_q", "max_k")

    def __init__(self, args, G, device):
        import numpy as np
        a0 = args[0]
        self.causal = a0.type == 1
        self.q_remote, self.k_remote = a0.q_remote, a0.k_remote

        def rows(lo, hi, remote, group):
            r = np.arange(lo, hi, dtype=np.int64)
            return r if remote else r * G + max(group, 0)
        self.q_idx = torch.from_numpy(np.concatenate([rows(a.q0, a.q1, a.q_remote, a.group) for a in args])).to(device)
        self.k_idx = torch.from_numpy(np.concatenate([rows(a.k0, a.k1, a.k_remote, a.group) for a in args])).to(device)
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


class _FlashStage:
    """A stage's args split for the flash backend, built once per plan and device: its batches, the args left
    to the torch kernels, and per side (q, k) and buffer (local, remote) the rows the batches read, so that a
    stage gathers each field of a buffer with one index_select into a buffer of the stage (`io`) whose rows
    are the batches' inputs, and adds each gradient back with one index_add (or hands it to the executor)."""
    __slots__ = ("batches", "rest", "q_side", "k_side", "merge")

    def __init__(self, args, G, qpg, device):
        groups, self.rest = {}, []
        for a in args:
            if a.index_width == 0 and a.type in (0, 1) and a.q1 > a.q0 and a.k1 > a.k0:
                groups.setdefault((a.type, a.q_remote, a.k_remote), []).append(a)
            else:
                self.rest.append(a)
        self.batches = [_FlashBatch(batch, G, device) for batch in groups.values()]
        self.q_side = {r: x for r in (False, True) if (x := _side(self.batches, r, ("q_remote", "q_idx"))) is not None}
        self.k_side = {r: x for r in (False, True) if (x := _side(self.batches, r, ("k_remote", "k_idx"))) is not None}
        rq = self.q_side.get(True)
        self.merge = None if rq is None else (rq[0], rq[0].view(-1, 1, 1).expand(-1, qpg, 1).contiguous())

    def buffers(self, pass_, b):
        """The stage's gathered inputs (and, backward, the kernels' gradient outputs) for this pass and
        dtype: per buffer and field one tensor, per batch its views. They live in the device's shared
        workspace (`b.take`: the same offsets every call of the plan, nothing kept between calls) and are the
        stage's own until its gradients are added (the executor adds local gradients at the end of the pass)."""
        dt = b.rk.dtype
        dqk, dv = b.rq.shape[-1], b.rv.shape[-1]
        if pass_ == "fwd":
            qf = [("q", dt, (b.qpg, dqk))]
            kf = [("k", dt, (b.kpg, dqk)), ("v", dt, (b.kpg, dv))]
        else:
            qf = [("q", dt, (b.qpg, dqk)), ("o", dt, (b.qpg, dv)), ("do", dt, (b.qpg, dv)),
                  ("lse", torch.float32, (b.qpg,)), ("dq", dt, (b.qpg, dqk))]
            kf = [("k", dt, (b.kpg, dqk)), ("v", dt, (b.kpg, dv)), ("dk", dt, (b.kpg, dqk)),
                  ("dv", dt, (b.kpg, dv))]
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
        return b.take((id(self), pass_, dt, b.qpg, b.kpg, dqk, dv), specs, build)


class FlashBackend(TorchBackend):
    """flash-attn varlen: the full and the causal range args of a stage are batched, per mask type and
    (q buffer, k buffer), into one varlen call each (flash's causal is bottom-right aligned, as the plan's),
    returning lse. A stage gathers each field of each buffer its batches read with one index_select (rows
    cached on the plan) into a buffer of the stage whose rows are the batches' inputs. Forward outputs for
    remote rows are merged into the accumulators with one lse-weighted scatter per stage; those of local rows
    are handed to the executor, which merges them with the returned partials in one scatter at the end of
    the pass. The backward calls flash's varlen backward per batch with the *final* O and lse of the rows (the
    merged ones), which is the exact gradient of each arg's share; each gradient is added back with one
    index_add per stage and buffer (local rows: by the executor, once per pass). inv_causal / bi_causal and
    index args run on the torch kernels. GPU, fp16 / bf16. Not run in this repository (no GPU): `kernel` /
    `bwd_kernel` can be replaced (the tests use a torch stand-in, the benchmark meta stubs)."""

    name = "flash"

    def __init__(self, kernel=None, bwd_kernel=None):
        self.kernel = kernel
        self.bwd_kernel = bwd_kernel

    def _split(self, args, b):
        device = b.q.device
        key = "_flash_" + str(device)
        hit = getattr(args, key, None) if hasattr(args, "__dict__") else None
        if hit is not None:
            return hit
        with torch.inference_mode(False):  # kept on the plan: ordinary tensors
            out = _FlashStage(args, b.q.shape[1] // b.qpg, b.qpg, device)
        if hasattr(args, "__dict__"):
            setattr(args, key, out)
        return out

    def _fwd_kernel(self):
        if self.kernel is not None:
            return self.kernel
        from flash_attn import flash_attn_varlen_func

        def run(q, k, v, cu_q, cu_k, mq, mk, scale, causal):
            out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, dropout_p=0.0, softmax_scale=scale,
                                                 causal=causal, return_attn_probs=True)
            return out, lse.transpose(0, 1)  # flash's varlen lse is [heads, total_q]
        return run

    def forward_stage(self, args, b):
        st = self._split(args, b)
        if st.rest:
            super().forward_stage(st.rest, b)
        if not st.batches:
            return
        kern = self._fwd_kernel()
        io, views = st.buffers("fwd", b)
        for remote, (idx, _) in st.q_side.items():
            torch.index_select(b.rq if remote else b.flat("q"), 0, idx, out=io["q"][remote]["q"])
        for remote, (idx, _) in st.k_side.items():
            t = io["k"][remote]
            torch.index_select(b.rk if remote else b.flat("k"), 0, idx, out=t["k"])
            torch.index_select(b.rv if remote else b.flat("v"), 0, idx, out=t["v"])
        remote_parts = []
        for x, v in zip(st.batches, views):
            o, lse = kern(v["q"], v["k"], v["v"], x.cu_q, x.cu_k, x.max_q, x.max_k, b.scale, x.causal)
            if x.q_remote:
                remote_parts.append((o, lse))
            else:  # merged with the pass's other partials of local rows at its end
                b.merge_local(o, lse, x.q_idx)
        if remote_parts:  # the order of the batches reading remote rows: that of the merge's rows
            idx, exp = st.merge
            o = torch.cat([p[0] for p in remote_parts]) if len(remote_parts) > 1 else remote_parts[0][0]
            lse = torch.cat([p[1] for p in remote_parts]) if len(remote_parts) > 1 else remote_parts[0][1]
            scatter_merge(b.ro, b.rlse_rows, idx, o, lse.unsqueeze(-1), exp)

    def backward_stage(self, args, b):
        st = self._split(args, b)
        if st.rest:
            super().backward_stage(st.rest, b)
        if not st.batches:
            return
        io, views = st.buffers("bwd", b)
        for remote, (idx, _) in st.q_side.items():
            t = io["q"][remote]
            srcs = (b.rq, b.rout, b.rdout, b.rlse) if remote else \
                (b.flat("q"), b.flat("out"), b.flat("dout"), b.flat("lse"))
            for name, src in zip(("q", "o", "do", "lse"), srcs):
                torch.index_select(src, 0, idx, out=t[name])
        for remote, (idx, _) in st.k_side.items():
            t = io["k"][remote]
            torch.index_select(b.rk if remote else b.flat("k"), 0, idx, out=t["k"])
            torch.index_select(b.rv if remote else b.flat("v"), 0, idx, out=t["v"])
        for x, v in zip(st.batches, views):
            self._bwd(v["do"], v["q"], v["k"], v["v"], v["o"], v["lse"], v["dq"], v["dk"], v["dv"], x.cu_q, x.cu_k,
                      x.max_q, x.max_k, b.scale, x.causal)
        cdt = b.rdq.dtype
        sides = (("q", st.q_side, ("dq",), (b.rdq,)), ("k", st.k_side, ("dk", "dv"), (b.rdk, b.rdv)))
        for side, rows, names, acc in sides:
            for remote, (idx, _) in rows.items():
                for name, a in zip(names, acc):
                    g = io[side][remote][name]
                    if remote:
                        a.index_add_(0, idx, g.to(cdt))
                    else:  # added with the pass's other gradients of local rows at its end
                        b.add_local(name, g, idx)

    def _bwd(self, do, q, k, v, o, lse, dq, dk, dv, cu_q, cu_k, mq, mk, scale, causal):
        if self.bwd_kernel is not None:
            return self.bwd_kernel(do, q, k, v, o, lse, dq, dk, dv, cu_q, cu_k, mq, mk, scale, causal)
        from flash_attn import flash_attn_interface as fi
        lse_t = lse.transpose(0, 1).contiguous()  # [heads, total_q], as flash keeps it
        try:  # flash-attn >= 2.6: window sizes and softcap as separate arguments
            fi._flash_attn_varlen_backward(do, q, k, v, o, lse_t, dq, dk, dv, cu_q, cu_k, mq, mk, 0.0, scale,
                                           causal, -1, -1, 0.0, None, False, None)
        except TypeError:  # flash-attn 2.4-2.5: window_size as a tuple
            fi._flash_attn_varlen_backward(do, q, k, v, o, lse_t, dq, dk, dv, cu_q, cu_k, mq, mk, 0.0, scale,
                                           causal, (-1, -1), None, False, None)


def _row_spans(geometry, rows):
    """Per row of a batch, the column span [lo, hi) of each arg that reaches it: int64 [rows, m] tables (m: the
    most args on one row; lo = hi = 0 where a row has fewer). An arg's rows each see one contiguous span of its
    columns under every mask type (docs/plan_format.md), so the batch's mask is these spans, O(rows x m), never
    a rows x columns table."""
    import numpy as np
    r_all, lo_all, hi_all = [], [], []
    for q0, q1, k0, k1, t in geometry:
        lq, lk = q1 - q0, k1 - k0
        i = np.arange(lq, dtype=np.int64)
        d = lk - lq
        if t == 0:
            lo, hi = np.zeros(lq, np.int64), np.full(lq, lk, np.int64)
        elif t == 1:
            lo, hi = np.zeros(lq, np.int64), np.clip(i + d + 1, 0, lk)
        elif t == 2:
            lo, hi = np.minimum(i, lk), np.full(lq, lk, np.int64)
        else:
            lo, hi = np.minimum(i, lk), np.clip(i + d + 1, 0, lk)
        keep = hi > lo
        r_all.append(i[keep] + q0)
        lo_all.append(lo[keep] + k0)
        hi_all.append(hi[keep] + k0)
    r = np.concatenate(r_all) if r_all else np.zeros(0, np.int64)
    lo = np.concatenate(lo_all) if lo_all else np.zeros(0, np.int64)
    hi = np.concatenate(hi_all) if hi_all else np.zeros(0, np.int64)
    order = np.argsort(r, kind="stable")
    r, lo, hi = r[order], lo[order], hi[order]
    counts = np.bincount(r, minlength=rows)
    m = max(1, int(counts.max()) if len(counts) else 1)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    slot = np.arange(len(r)) - first[r]
    LO = np.zeros((rows, m), np.int64)
    HI = np.zeros((rows, m), np.int64)
    LO[r, slot] = lo
    HI[r, slot] = hi
    return r, lo, hi, LO, HI


def _kv_blocks(r, lo, hi, rows, cols, B):
    """FlexAttention's block lists from the spans: per q block of B rows the kv blocks some row reaches
    (partial) and those every row of a whole q block covers entirely (full), from difference arrays over
    (q block, kv block): O(spans + blocks^2), never rows x columns."""
    import numpy as np
    nqb, nkb = -(-rows // B), -(-cols // B)
    qb = r // B
    touched = np.zeros((nqb, nkb + 1), np.int32)
    np.add.at(touched, (qb, lo // B), 1)
    np.add.at(touched, (qb, (hi - 1) // B + 1), -1)
    touched = np.cumsum(touched, 1)[:, :nkb] > 0
    f0, f1 = -(-lo // B), np.minimum(hi // B, cols // B)  # kv blocks inside the span (and inside the columns)
    ok = f1 > f0
    cover = np.zeros((nqb, nkb + 1), np.int32)
    np.add.at(cover, (qb[ok], f0[ok]), 1)
    np.add.at(cover, (qb[ok], f1[ok]), -1)
    cover = np.cumsum(cover, 1)[:, :nkb]
    whole_q = (np.arange(nqb) + 1) * B <= rows
    full = (cover == B) & whole_q[:, None]
    partial = touched & ~full

    def lists(m):
        num = m.sum(1).astype(np.int32)
        idx = np.argsort(~m, axis=1, kind="stable").astype(np.int32)  # the set blocks first, ascending
        return num, idx
    return lists(partial), lists(full)


class _FlexMask:
    """The block mask of one batch geometry: FlexAttention's BlockMask built from the args' row spans (the union
    of the args' masks; they are exact and disjoint), blockwise, with the rows no arg reaches."""

    def __init__(self, create_block_mask, geometry, shape, device, block=128):
        import numpy as np
        rows, cols = shape
        r, lo, hi, LO, HI = _row_spans(geometry, rows)
        with torch.inference_mode(False):
            lo_t = torch.from_numpy(LO).to(device)
            hi_t = torch.from_numpy(HI).to(device)

            def mask_mod(bb, h, qi, ki):
                return ((ki >= lo_t[qi]) & (ki < hi_t[qi])).any(-1)
            from torch.nn.attention.flex_attention import BlockMask
            if hasattr(BlockMask, "from_kv_blocks"):
                (pn, pi), (fn, fi) = _kv_blocks(r, lo, hi, rows, cols, block)

                def dev(x):
                    return torch.from_numpy(np.ascontiguousarray(x)).to(device)[None, None]
                self.block_mask = BlockMask.from_kv_blocks(dev(pn), dev(pi), dev(fn), dev(fi), BLOCK_SIZE=block,
                                                           mask_mod=mask_mod, seq_lengths=(rows, cols))
            else:  # torch 2.4: flex evaluates the spans itself (no L x L table of ours)
                self.block_mask = create_block_mask(mask_mod, None, None, rows, cols, device=str(device))
            empty = (HI <= LO).all(1)
            self.empty = torch.from_numpy(empty).to(device)
        self.has_empty = bool(empty.any())  # known on the host: no device sync per call
        self.nbytes = LO.nbytes + HI.nbytes + 2 * 4 * (-(-rows // block)) * (1 + (-(-cols // block))) + rows


class _ByteLru:
    """An LRU map whose entries weigh their table's bytes: at most `max_bytes` in all (and the newest entry)."""

    def __init__(self, max_bytes):
        self.max_bytes, self.bytes, self.items = max_bytes, 0, collections.OrderedDict()
        self.lock = threading.Lock()  # the ranks of a loopback group are threads of one process

    def get(self, key):
        with self.lock:
            hit = self.items.get(key)
            if hit is not None:
                self.items.move_to_end(key)
                return hit[0]
        return None

    def put(self, key, value, nbytes):
        with self.lock:
            old = self.items.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self.items[key] = (value, nbytes)
            self.bytes += nbytes
            while self.bytes > self.max_bytes and len(self.items) > 1:
                _, (_, n) = self.items.popitem(last=False)
                self.bytes -= n


# Block masks by batch geometry (row spans and block lists, O(rows + blocks^2) bytes each, never rows x
# columns): at most 256 MiB per process.
_FLEX_MASKS = _ByteLru(1 << 28)


class FlexBackend(TorchBackend):
    """FlexAttention: per stage and (q buffer, k buffer, head group) one flex_attention call whose block mask
    is built from the args that read them (each row's column spans and the block lists they give, blockwise:
    never a rows x columns table; the args are exact and disjoint, so the union is the mask). Forward returns lse and is merged like every
    partial. Backward: on a GPU flex's own backward through the lse-merge surrogate; on the CPU (torch has no
    flex backward there) the torch kernels. Index args use the gather kernel."""

    name = "flex"

    def __init__(self, compile=False):
        """compile: on CUDA tensors, run flex_attention through torch.compile (dynamic shapes): its fused
        kernels exist only compiled, eager flex_attention materialises the scores. (Compiled flex on the CPU
        has no lse output, so CPU tensors always run eager.)"""
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        self._eager = flex_attention
        self._compiled = torch.compile(flex_attention, dynamic=True) if compile else None
        self._mask = create_block_mask
        try:
            from torch.nn.attention.flex_attention import AuxRequest
            self._aux = AuxRequest
        except ImportError:
            self._aux = None

    def _groups(self, args):
        out = {}
        rest = []
        for a in args:
            if a.index_width > 0 or a.q1 <= a.q0 or a.k1 <= a.k0:
                rest.append(a)
            else:
                out.setdefault((a.q_remote, a.k_remote, a.group), []).append(a)
        return out, rest

    def _block_mask(self, batch, device):
        """(FlexMask, r0, r1, c0, c1) of a batch: its rows [r0, r1) and columns [c0, c1) and the block mask of their
        union. Cached by the args' geometry relative to (r0, c0): every head group of a flattened plan and
        every call of the plan (each layer of a step) reuses it (docs/torch.md, "On a GPU")."""
        r0 = min(a.q0 for a in batch)
        c0 = min(a.k0 for a in batch)
        shape = (max(a.q1 for a in batch) - r0, max(a.k1 for a in batch) - c0)
        key = (str(device), shape, tuple(sorted((a.q0 - r0, a.q1 - r0, a.k0 - c0, a.k1 - c0, a.type) for a in batch)))
        fm = _FLEX_MASKS.get(key)
        if fm is None:
            fm = _FlexMask(self._mask, key[2], shape, device)
            _FLEX_MASKS.put(key, fm, fm.nbytes)
        return fm, r0, r0 + shape[0], c0, c0 + shape[1]

    def _call(self, q, k, v, fm, scale):
        dev = q.device
        bm = fm.block_mask
        flex = self._compiled if self._compiled is not None and dev.type == "cuda" else self._eager
        qq = q.permute(1, 0, 2).unsqueeze(0)
        kk = k.permute(1, 0, 2).unsqueeze(0)
        vv = v.permute(1, 0, 2).unsqueeze(0)
        gqa = qq.shape[1] != kk.shape[1]
        if self._aux is not None:
            o, aux = flex(qq, kk, vv, block_mask=bm, scale=scale, enable_gqa=gqa,
                                return_aux=self._aux(lse=True))
            lse = aux.lse
        else:
            o, lse = flex(qq, kk, vv, block_mask=bm, scale=scale, enable_gqa=gqa, return_lse=True)
        o = o[0].permute(1, 0, 2).float()
        lse = lse[0].permute(1, 0).float()
        if fm.has_empty:  # flex leaves rows without an entry at lse -inf (or a large negative)
            lse = lse.masked_fill(fm.empty[:, None], float("-inf"))
            o = o.masked_fill(fm.empty[:, None, None], 0.0)
        return o, lse

    def forward_stage(self, args, b):
        groups, rest = self._groups(args)
        super().forward_stage(rest, b)
        for (qr, kr, grp), batch in groups.items():
            fm, r0, r1, c0, c1 = self._block_mask(batch, b.q.device)
            a = batch[0]
            qh, kh = _heads(a, b.qpg), _heads(a, b.kpg)
            q = b.rq[r0:r1] if qr else b.q[r0:r1, qh]
            k = b.rk[c0:c1] if kr else b.k[c0:c1, kh]
            v = b.rv[c0:c1] if kr else b.v[c0:c1, kh]
            with torch.no_grad():  # the executor's own backward differentiates; flex must not record a graph
                o, lse = self._call(q.detach(), k.detach(), v.detach(), fm, b.scale)
            if qr:
                merge_into(b.ro[r0:r1], b.rlse[r0:r1], o, lse)
            else:
                merge_into(b.o[r0:r1, qh], b.lse[r0:r1, qh], o, lse)

    def backward_stage(self, args, b):
        if b.q.device.type == "cpu":  # torch: "FlexAttention does not support backward on CPU"
            return super().backward_stage(args, b)
        groups, rest = self._groups(args)
        super().backward_stage(rest, b)
        for (qr, kr, grp), batch in groups.items():
            fm, r0, r1, c0, c1 = self._block_mask(batch, b.q.device)
            a = batch[0]
            qh, kh = _heads(a, b.qpg), _heads(a, b.kpg)
            sq = slice(r0, r1)
            q = (b.rq[sq] if qr else b.q[sq, qh]).detach().requires_grad_()
            k = (b.rk[c0:c1] if kr else b.k[c0:c1, kh]).detach().requires_grad_()
            v = (b.rv[c0:c1] if kr else b.v[c0:c1, kh]).detach().requires_grad_()
            dout = (b.rdout[sq] if qr else b.dout[sq, qh]).float()
            lse_f = (b.rlse[sq] if qr else b.lse[sq, qh]).float()
            delta = b.rdelta[sq] if qr else b.delta[sq, qh]
            with torch.enable_grad():
                o, lse = self._call(q, k, v, fm, b.scale)
                # d/dS of the final O through this partial: P_final (dP - delta) with P_final = w P_i,
                # w = exp(lse_i - lse); the surrogate's gradient is exactly that (docs/torch.md)
                w = torch.exp(lse.detach() - lse_f).nan_to_num(0.0)
                gterm = ((dout * o.detach()).sum(-1) - delta).detach()
                sur = (w.unsqueeze(-1) * dout * o).sum() + (w * gterm * lse.masked_fill(torch.isinf(lse), 0)).sum()
                gq, gk, gv = torch.autograd.grad(sur, (q, k, v), allow_unused=True)
            (b.rdq[sq] if qr else b.dq[sq, qh]).add_(gq.float())
            if kr:
                b.rdk[c0:c1].add_(gk.float())
                (b.rdk[c0:c1, :, :b.rv.shape[-1]] if b.shared else b.rdv[c0:c1]).add_(gv.float())
            else:
                b.dk[c0:c1, kh].add_(gk.float())
                (b.dk[c0:c1, kh, :b.v.shape[-1]] if b.shared else b.dv[c0:c1, kh]).add_(gv.float())


def make_backend(name, device, dtype, tp):
    """The backend object for `name` ('auto', 'torch', 'flash', 'flex') on `device`, or a ValueError naming
    why it cannot run there."""
    if not isinstance(name, str):
        if hasattr(name, "forward_stage") and hasattr(name, "backward_stage"):
            return name  # a backend object (benchmarks, tests)
        raise ValueError(f"backend: expected 'auto', 'torch', 'flash' or 'flex', got {name!r}")
    if name == "auto":
        if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and flash_available() \
                and tp.dqk <= 256 and tp.dv <= 256 and not tp.kv_shared:
            return FlashBackend()
        # Without flash-attn the torch kernels, not eager flex, which they beat on a GPU in both passes
        # (docs/torch.md, "On a GPU"); flex stays available by name.
        return TorchBackend()
    if name == "torch":
        return TorchBackend()
    if name == "flash":
        if device.type != "cuda":
            raise ValueError(f"backend='flash': flash-attn runs on CUDA tensors; q is on {device}")
        if not flash_available():
            raise ValueError("backend='flash': flash_attn is not installed (pip install flash-attn), or does not "
                             "import with this torch")
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"backend='flash': flash-attn takes float16 or bfloat16, q is {dtype}")
        if tp.kv_shared:
            raise ValueError("backend='flash': a shared latent KV (kv_shared) needs the torch kernels")
        return FlashBackend()
    if name == "flex":
        if not flex_available():
            raise ValueError(f"backend='flex': torch {torch.__version__} has no torch.nn.attention.flex_attention")
        return FlexBackend()
    if name == "none":
        from ._kernels import NullBackend
        return NullBackend()
    raise ValueError(f"backend: expected 'auto', 'torch', 'flash' or 'flex', got {name!r}")
