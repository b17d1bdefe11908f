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


def _gather_q(args, b, field_local, field_remote, per_group):
    """Rows of the args' q buffers, concatenated in arg order: [sum lq, heads of a group, dim]."""
    parts = []
    for a in args:
        qh = _heads(a, per_group)
        parts.append(field_remote[a.q0:a.q1] if a.q_remote else field_local[a.q0:a.q1, qh])
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def _gather_k(args, b, field_local, field_remote, per_group):
    parts = []
    for a in args:
        kh = _heads(a, per_group)
        parts.append(field_remote[a.k0:a.k1] if a.k_remote else field_local[a.k0:a.k1, kh])
    return torch.cat(parts) if len(parts) > 1 else parts[0]


class FlashBackend(TorchBackend):
    """flash-attn varlen: every full or causal range arg of a stage is one sequence of one varlen call per mask
    type (flash's causal is bottom-right aligned, as the plan's), returning lse; the outputs are merged into the
    accumulators by lse. The backward calls flash's varlen backward per batch with the *final* O and lse of the
    rows (the merged ones), which is the exact gradient of each arg's share. GPU, fp16 / bf16, head dims flash
    supports. Not run in this repository (no GPU): `kernel` can be replaced (benchmarks run its host side on
    meta tensors)."""

    name = "flash"

    def __init__(self, kernel=None, bwd_kernel=None):
        self.kernel = kernel
        self.bwd_kernel = bwd_kernel

    def _split(self, args, device):
        """(by mask type: (args, cu_q, cu_k, max_q, max_k)), other args), cached on the plan's arg list."""
        key = "_flash_" + str(device)
        hit = getattr(args, key, None) if hasattr(args, "__dict__") else None
        if hit is not None:
            return hit
        by_type = {0: [], 1: []}
        rest = []
        for a in args:
            if a.index_width == 0 and a.type in by_type and a.q1 > a.q0 and a.k1 > a.k0:
                by_type[a.type].append(a)
            else:
                rest.append(a)
        out = ({t: (batch,) + self._cu(batch, device) for t, batch in by_type.items() if batch}, rest)
        if hasattr(args, "__dict__"):
            setattr(args, key, out)
        return out

    @staticmethod
    def _cu(args, device):
        lq = [a.q1 - a.q0 for a in args]
        lk = [a.k1 - a.k0 for a in args]
        cu_q = torch.tensor([0] + lq, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device, non_blocking=True)
        cu_k = torch.tensor([0] + lk, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device, non_blocking=True)
        return cu_q, cu_k, max(lq), max(lk)

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
        by_type, rest = self._split(args, b.q.device)
        super().forward_stage(rest, b)
        kern = self._fwd_kernel()
        for t, (batch, cu_q, cu_k, mq, mk) in by_type.items():
            q = _gather_q(batch, b, b.q, b.rq, b.qpg)
            k = _gather_k(batch, b, b.k, b.rk, b.kpg)
            v = _gather_k(batch, b, b.v, b.rv, b.kpg)
            o, lse = kern(q, k, v, cu_q, cu_k, mq, mk, b.scale, t == 1)
            o, lse = o.float(), lse.float()
            at = 0
            for a in batch:  # views of the batch's rows, merged arg by arg (rows of two args may coincide)
                n = a.q1 - a.q0
                if a.q_remote:
                    merge_into(b.ro[a.q0:a.q1], b.rlse[a.q0:a.q1], o[at:at + n], lse[at:at + n])
                else:
                    qh = _heads(a, b.qpg)
                    merge_into(b.o[a.q0:a.q1, qh], b.lse[a.q0:a.q1, qh], o[at:at + n], lse[at:at + n])
                at += n

    def backward_stage(self, args, b):
        by_type, rest = self._split(args, b.q.device)
        super().backward_stage(rest, b)
        for t, (batch, cu_q, cu_k, mq, mk) in by_type.items():
            q = _gather_q(batch, b, b.q, b.rq, b.qpg)
            o = _gather_q(batch, b, b.out, b.rout, b.qpg)
            do = _gather_q(batch, b, b.dout, b.rdout, b.qpg)
            lse = _gather_q(batch, b, b.lse, b.rlse, b.qpg).float()
            k = _gather_k(batch, b, b.k, b.rk, b.kpg)
            v = _gather_k(batch, b, b.v, b.rv, b.kpg)
            dq = torch.empty_like(q)
            dk = torch.empty_like(k)
            dv = torch.empty_like(v)
            self._bwd(do, q, k, v, o, lse, dq, dk, dv, cu_q, cu_k, mq, mk, b.scale, t == 1)
            aq = ak = 0
            for a in batch:
                n, m = a.q1 - a.q0, a.k1 - a.k0
                qh, kh = _heads(a, b.qpg), _heads(a, b.kpg)
                tq = b.rdq[a.q0:a.q1] if a.q_remote else b.dq[a.q0:a.q1, qh]
                tq += dq[aq:aq + n].float()
                if a.k_remote:
                    tk = b.rdk[a.k0:a.k1]
                    tv = b.rdk[a.k0:a.k1, :, :b.rv.shape[-1]] if b.shared else b.rdv[a.k0:a.k1]
                else:
                    tk = b.dk[a.k0:a.k1, kh]
                    tv = b.dk[a.k0:a.k1, kh, :b.v.shape[-1]] if b.shared else b.dv[a.k0:a.k1, kh]
                tk += dk[ak:ak + m].float()
                tv += dv[ak:ak + m].float()
                aq += n
                ak += m

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


_ = scatter_merge  # re-exported for the benchmarks


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
