"""Kernel backends beyond the torch reference: flash-attn's varlen kernels and FlexAttention, each built from
a stage's args, and the `auto` choice.

Neither has run on a GPU in this repository (the machine has none); `flex`'s forward runs on the CPU in eager
mode and is tested there against the torch kernel. Both fall back to the torch kernels for what they cannot
express (flash: inv_causal / bi_causal args and index args; flex: the backward on the CPU and index args).
"""
from __future__ import annotations

import functools

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
    per plan and device and cached on the plan's arg list, and so are the gradient buffers the backward
    kernel writes (per dtype; they are consumed by the same stage's adds, so every call can reuse them)."""
    __slots__ = ("causal", "q_remote", "k_remote", "q_idx", "k_idx", "cu_q", "cu_k", "max_q", "max_k", "grads")

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
        self.grads = {}

    def grad_buffers(self, q, k, v):
        key = (q.dtype, q.shape[1:], k.shape[1:], v.shape[1:])
        g = self.grads.get(key)
        if g is None:
            g = self.grads[key] = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
        return g


class _FlashStage:
    """A stage's args split for the flash backend: its batches, the args left to the torch kernels, and per
    q buffer (local, remote) the batches' rows concatenated for one merge (with the index scatter_merge
    takes), all built once per plan and device."""
    __slots__ = ("batches", "rest", "merge")

    def __init__(self, args, G, qpg, device):
        groups, self.rest = {}, []
        for a in args:
            if a.index_width == 0 and a.type in (0, 1) and a.q1 > a.q0 and a.k1 > a.k0:
                groups.setdefault((a.type, a.q_remote, a.k_remote), []).append(a)
            else:
                self.rest.append(a)
        self.batches = [_FlashBatch(batch, G, device) for batch in groups.values()]
        self.merge = {}
        for remote in (False, True):
            mine = [x for x in self.batches if x.q_remote == remote]
            if mine:
                idx = torch.cat([x.q_idx for x in mine]) if len(mine) > 1 else mine[0].q_idx
                self.merge[remote] = (idx, idx.view(-1, 1, 1).expand(-1, qpg, 1).contiguous())


class FlashBackend(TorchBackend):
    """flash-attn varlen: the full and the causal range args of a stage are batched, per mask type and
    (q buffer, k buffer), into one varlen call each (flash's causal is bottom-right aligned, as the plan's),
    returning lse; a batch's rows are gathered with one index_select per tensor from indices cached on the
    plan. Forward outputs for remote rows are merged into the accumulators with one lse-weighted scatter per
    stage; those of local rows are handed to the executor, which merges them with the returned partials in
    one scatter at the end of the pass. The backward calls flash's varlen backward per batch with the *final*
    O and lse of the rows (the merged ones), which is the exact gradient of each arg's share, and adds dQ, dK,
    dV back with index_add. inv_causal / bi_causal and index args run on the torch kernels. GPU, fp16 / bf16.
    Not run in this repository (no GPU): `kernel` / `bwd_kernel` can be replaced (the tests use a torch
    stand-in, the benchmark meta stubs)."""

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
        qf, kf, vf = b.flat("q"), b.flat("k"), b.flat("v")
        parts = {False: [], True: []}
        for x in st.batches:
            q = (b.rq if x.q_remote else qf).index_select(0, x.q_idx)
            k = (b.rk if x.k_remote else kf).index_select(0, x.k_idx)
            v = (b.rv if x.k_remote else vf).index_select(0, x.k_idx)
            o, lse = kern(q, k, v, x.cu_q, x.cu_k, x.max_q, x.max_k, b.scale, x.causal)
            if x.q_remote:
                parts[True].append((o, lse))
            else:
                b.merge_local(o, lse, x.q_idx)
        lst = parts[True]
        if lst:
            idx, exp = st.merge[True]
            o = torch.cat([p[0] for p in lst]) if len(lst) > 1 else lst[0][0]
            lse = torch.cat([p[1] for p in lst]) if len(lst) > 1 else lst[0][1]
            scatter_merge(b.ro, b.rlse_rows, idx, o, lse.unsqueeze(-1), exp)

    def backward_stage(self, args, b):
        st = self._split(args, b)
        if st.rest:
            super().backward_stage(st.rest, b)
        if not st.batches:
            return
        cdt = b.rdq.dtype
        for x in st.batches:
            if x.q_remote:
                qs, os_, dos, ls, dqa = b.rq, b.rout, b.rdout, b.rlse, b.rdq
            else:
                qs, os_, dos, ls, dqa = b.flat("q"), b.flat("out"), b.flat("dout"), b.flat("lse"), b.dq_rows
            if x.k_remote:
                ks, vs, dka, dva = b.rk, b.rv, b.rdk, b.rdv
            else:
                ks, vs, dka, dva = b.flat("k"), b.flat("v"), b.dk_rows, b.dv_rows
            q = qs.index_select(0, x.q_idx)
            o = os_.index_select(0, x.q_idx)
            do = dos.index_select(0, x.q_idx)
            lse = ls.index_select(0, x.q_idx).float()
            k = ks.index_select(0, x.k_idx)
            v = vs.index_select(0, x.k_idx)
            dq, dk, dv = x.grad_buffers(q, k, v)
            self._bwd(do, q, k, v, o, lse, dq, dk, dv, x.cu_q, x.cu_k, x.max_q, x.max_k, b.scale, x.causal)
            dqa.index_add_(0, x.q_idx, dq.to(cdt))
            dka.index_add_(0, x.k_idx, dk.to(cdt))
            dva.index_add_(0, x.k_idx, dv.to(cdt))

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


class FlexBackend(TorchBackend):
    """FlexAttention: per stage and (q buffer, k buffer, head group) one flex_attention call whose block mask
    is built from the args that read them (a boolean table over the rows and columns the args touch; the
    args are exact and disjoint, so the union is the mask). Forward returns lse and is merged like every
    partial. Backward: on a GPU flex's own backward through the lse-merge surrogate; on the CPU (torch has no
    flex backward there) the torch kernels. Index args use the gather kernel."""

    name = "flex"

    def __init__(self):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        self._flex = flex_attention
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

    def _table(self, batch, device):
        from ._kernels import chunk_mask
        r0 = min(a.q0 for a in batch)
        r1 = max(a.q1 for a in batch)
        c0 = min(a.k0 for a in batch)
        c1 = max(a.k1 for a in batch)
        table = torch.zeros((r1 - r0, c1 - c0), dtype=torch.bool, device=device)
        for a in batch:
            lq, lk = a.q1 - a.q0, a.k1 - a.k0
            m = chunk_mask(a.type, 0, lq, 0, lk, lq, lk, device)
            view = table[a.q0 - r0:a.q1 - r0, a.k0 - c0:a.k1 - c0]
            view |= True if m is None else m
        return table, r0, r1, c0, c1

    def _call(self, q, k, v, table, scale):
        n, m = table.shape
        dev = q.device

        def mask_mod(bb, h, qi, ki):
            return table[qi, ki]
        bm = self._mask(mask_mod, None, None, n, m, device=str(dev))
        qq = q.permute(1, 0, 2).unsqueeze(0)
        kk = k.permute(1, 0, 2).unsqueeze(0)
        vv = v.permute(1, 0, 2).unsqueeze(0)
        gqa = qq.shape[1] != kk.shape[1]
        if self._aux is not None:
            o, aux = self._flex(qq, kk, vv, block_mask=bm, scale=scale, enable_gqa=gqa,
                                return_aux=self._aux(lse=True))
            lse = aux.lse
        else:
            o, lse = self._flex(qq, kk, vv, block_mask=bm, scale=scale, enable_gqa=gqa, return_lse=True)
        o = o[0].permute(1, 0, 2).float()
        lse = lse[0].permute(1, 0).float()
        empty = ~table.any(dim=1)  # flex leaves rows without an entry at lse -inf (or a large negative)
        if bool(empty.any()):
            lse = lse.masked_fill(empty[:, None], float("-inf"))
            o = o.masked_fill(empty[:, None, None], 0.0)
        return o, lse

    def forward_stage(self, args, b):
        groups, rest = self._groups(args)
        super().forward_stage(rest, b)
        for (qr, kr, grp), batch in groups.items():
            table, r0, r1, c0, c1 = self._table(batch, b.q.device)
            a = batch[0]
            qh, kh = _heads(a, b.qpg), _heads(a, b.kpg)
            q = b.rq[r0:r1] if qr else b.q[r0:r1, qh]
            k = b.rk[c0:c1] if kr else b.k[c0:c1, kh]
            v = b.rv[c0:c1] if kr else b.v[c0:c1, kh]
            with torch.no_grad():  # the executor's own backward differentiates; flex must not record a graph
                o, lse = self._call(q.detach(), k.detach(), v.detach(), table, b.scale)
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
            table, r0, r1, c0, c1 = self._table(batch, b.q.device)
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
                o, lse = self._call(q, k, v, table, b.scale)
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
        if device.type == "cuda" and flex_available():
            return FlexBackend()
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
