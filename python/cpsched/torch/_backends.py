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

from ._kernels import TorchBackend, _heads, merge_into
from ._varlen import VarlenBackend


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


class FlashBackend(VarlenBackend):
    """flash-attn's varlen kernels on the shared varlen batching (_varlen.py: full, causal, inv_causal as causal
    on reversed rows, bi_causal as a window), with lse. GPU, fp16 / bf16, flash-attn >= 2.4 (window_size).
    Not run in this repository (no flash-attn on the GPU machine): `kernel` / `bwd_kernel` can be replaced
    (the tests use a torch stand-in, the benchmark meta stubs) with the `_fwd` / `_bwd` signatures of
    VarlenBackend."""

    name = "flash"
    grads_in_place = True

    def __init__(self, kernel=None, bwd_kernel=None, index="torch"):
        super().__init__(index=index)
        self.kernel = kernel
        self.bwd_kernel = bwd_kernel

    def graph_key(self):
        return super().graph_key() + (id(self.kernel), id(self.bwd_kernel))

    def _fwd(self, q, k, v, cu_q, cu_k, mq, mk, scale, causal, window):
        if self.kernel is not None:
            return self.kernel(q, k, v, cu_q, cu_k, mq, mk, scale, causal, window)
        from flash_attn import flash_attn_varlen_func
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, dropout_p=0.0, softmax_scale=scale,
                                             causal=causal, window_size=window, return_attn_probs=True)
        return out, lse.transpose(0, 1)  # flash's varlen lse is [heads, total_q]

    def _bwd(self, do, q, k, v, o, lse_hn, cu_q, cu_k, mq, mk, scale, causal, window, dq, dk, dv):
        if self.bwd_kernel is not None:
            self.bwd_kernel(do, q, k, v, o, lse_hn, dq, dk, dv, cu_q, cu_k, mq, mk, scale, causal, window)
            return dq, dk, dv
        from flash_attn import flash_attn_interface as fi
        try:  # flash-attn >= 2.6: window sizes and softcap as separate arguments
            fi._flash_attn_varlen_backward(do, q, k, v, o, lse_hn, dq, dk, dv, cu_q, cu_k, mq, mk, 0.0, scale,
                                           causal, window[0], window[1], 0.0, None, False, None)
        except TypeError:  # flash-attn 2.4-2.5: window_size as a tuple
            fi._flash_attn_varlen_backward(do, q, k, v, o, lse_hn, dq, dk, dv, cu_q, cu_k, mq, mk, 0.0, scale,
                                           causal, tuple(window), None, False, None)
        return dq, dk, dv


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
            qh, kh = _heads(a, b.q_per_group), _heads(a, b.kv_per_group)
            q = b.remote_q[r0:r1] if qr else b.q[r0:r1, qh]
            k = b.remote_k[c0:c1] if kr else b.k[c0:c1, kh]
            v = b.remote_v[c0:c1] if kr else b.v[c0:c1, kh]
            with torch.no_grad():  # the executor's own backward differentiates; flex must not record a graph
                o, lse = self._call(q.detach(), k.detach(), v.detach(), fm, b.scale)
            if qr:
                merge_into(b.remote_o[r0:r1], b.remote_lse[r0:r1], o, lse)
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
            qh, kh = _heads(a, b.q_per_group), _heads(a, b.kv_per_group)
            sq = slice(r0, r1)
            q = (b.remote_q[sq] if qr else b.q[sq, qh]).detach().requires_grad_()
            k = (b.remote_k[c0:c1] if kr else b.k[c0:c1, kh]).detach().requires_grad_()
            v = (b.remote_v[c0:c1] if kr else b.v[c0:c1, kh]).detach().requires_grad_()
            dout = (b.remote_dout[sq] if qr else b.dout[sq, qh]).float()
            lse_f = (b.remote_lse[sq] if qr else b.lse[sq, qh]).float()
            delta = b.remote_delta[sq] if qr else b.delta[sq, qh]
            with torch.enable_grad():
                o, lse = self._call(q, k, v, fm, b.scale)
                # d/dS of the final O through this partial: P_final (dP - delta) with P_final = w P_i,
                # w = exp(lse_i - lse); the surrogate's gradient is exactly that (docs/torch.md)
                w = torch.exp(lse.detach() - lse_f).nan_to_num(0.0)
                gterm = ((dout * o.detach()).sum(-1) - delta).detach()
                sur = (w.unsqueeze(-1) * dout * o).sum() + (w * gterm * lse.masked_fill(torch.isinf(lse), 0)).sum()
                gq, gk, gv = torch.autograd.grad(sur, (q, k, v), allow_unused=True)
            (b.remote_dq[sq] if qr else b.dq[sq, qh]).add_(gq.float())
            if kr:
                b.remote_dk[c0:c1].add_(gk.float())
                (b.remote_dk[c0:c1, :, :b.remote_v.shape[-1]] if b.shared else b.remote_dv[c0:c1]).add_(gv.float())
            else:
                b.dk[c0:c1, kh].add_(gk.float())
                (b.dk[c0:c1, kh, :b.v.shape[-1]] if b.shared else b.dv[c0:c1, kh]).add_(gv.float())


_NAMES = "'auto', 'torch', 'aten', 'flash', 'flex' or 'triton'"


def _flash_applies(device, dtype, tp):
    return device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and flash_available() \
        and tp.dqk <= 256 and tp.dv <= 256 and not tp.kv_shared


def make_backend(name, device, dtype, tp):
    """The backend object for `name` on `device`, or a ValueError naming why it cannot run there.

    auto: on CUDA the range args on flash-attn where it imports and applies, else on PyTorch's FA2 ops (aten)
    where they apply, else on the torch kernels; index args on the Triton kernels where Triton runs, else on
    the torch gather kernel. On the CPU the torch kernels. triton: index args on Triton, range args on aten
    where it applies, else on the torch kernels."""
    from ._aten import AtenBackend, aten_unavailable
    from ._triton import triton_unavailable
    if not isinstance(name, str):
        if hasattr(name, "forward_stage") and hasattr(name, "backward_stage"):
            return name  # a backend object (benchmarks, tests)
        raise ValueError(f"backend: expected {_NAMES}, got {name!r}")
    if name == "auto":
        if device.type != "cuda":
            return TorchBackend()
        index = "triton" if tp.has_index_args and triton_unavailable(device, dtype, tp) is None else "torch"
        if _flash_applies(device, dtype, tp):
            return FlashBackend(index=index)
        if aten_unavailable(device, dtype, tp) is None:
            return AtenBackend(index=index)
        # Without FA2 the torch kernels, not eager flex, which they beat on a GPU in both passes
        # (docs/torch.md, "On a GPU"); flex stays available by name.
        return TorchBackend(index=index)
    if name == "torch":
        return TorchBackend()
    if name == "aten":
        why = aten_unavailable(device, dtype, tp)
        if why is not None:
            raise ValueError(f"backend='aten': {why}")
        return AtenBackend()
    if name == "triton":
        why = triton_unavailable(device, dtype, tp)
        if why is not None:
            raise ValueError(f"backend='triton': {why}")
        if device.type == "cuda" and aten_unavailable(device, dtype, tp) is None:
            return AtenBackend(index="triton")
        return TorchBackend(index="triton")
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
    raise ValueError(f"backend: expected {_NAMES}, got {name!r}")
