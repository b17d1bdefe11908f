"""The `aten` backend: PyTorch's own FlashAttention-2 kernels (every CUDA build of torch ships them), called
through `torch.ops.aten._flash_attention_forward` / `_flash_attention_backward` on the shared varlen batches
(_varlen.py).

What the ops take and give (torch 2.11 and 2.15 alike; the code passes only what both have):

    _flash_attention_forward(q [total_q, Hq, d], k [total_k, Hk, d], v, cum_seq_q int32 [B + 1],
        cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, *, scale, window_size_left,
        window_size_right) -> (O [total_q, Hq, d], LSE fp32 [Hq, total_q], rng_state, unused, debug mask)
    _flash_attention_backward(dO, q, k, v, O, LSE [Hq, total_q], cum_seq_q, cum_seq_k, max_q, max_k,
        dropout_p, is_causal, rng_state, unused, *, scale, window_size_left, window_size_right) -> (dQ, dK, dV)

The LSE of varlen mode is [heads, total_q], unpadded (flash_api.cpp's mha_varlen_fwd allocates
{num_heads, total_q}; torch's meta registration of the forward says the same). Causal and windows are aligned
bottom-right per sequence; a row with no key gets O = 0 and LSE = +inf (the merge reads it as no
contribution). The backward takes any O and LSE, so it takes the merged ones. GQA is native (Hq a multiple of
Hk); fp16 / bf16; d <= 256, a multiple of 8 (the ops do not pad), d_qk = d_v; sm80 or newer.
"""
from __future__ import annotations

import torch

from ._varlen import VarlenBackend


def aten_unavailable(device, dtype, tp):
    """Why the aten backend cannot run a plan's range args here (a sentence), or None when it can."""
    if device.type != "cuda":
        return f"PyTorch's FlashAttention-2 ops run on CUDA tensors; q is on {device}"
    try:
        if not torch.backends.cuda.is_flash_attention_available():
            return f"this torch build ({torch.__version__}) has no FlashAttention-2 kernels"
    except AttributeError:  # an older torch without the query: try the ops
        if not hasattr(torch.ops.aten, "_flash_attention_forward"):
            return f"torch {torch.__version__} has no aten._flash_attention_forward"
    major, _ = torch.cuda.get_device_capability(device)
    if major < 8:
        return f"FlashAttention-2 needs sm80 or newer, {torch.cuda.get_device_name(device)} is sm{major}x"
    return aten_shape_unsupported(dtype, tp)


def aten_shape_unsupported(dtype, tp):
    """Why FA2 cannot take a plan's heads and dtype (a sentence), or None."""
    if dtype not in (torch.float16, torch.bfloat16):
        return f"FlashAttention-2 takes float16 or bfloat16, q is {dtype}"
    if tp.kv_shared:
        return "a shared latent KV (kv_shared) runs on the other kernels"
    if tp.dqk != tp.dv:
        return f"FlashAttention-2 needs d_qk = d_v, the plan has {tp.dqk} and {tp.dv}"
    if tp.dqk > 256 or tp.dqk % 8:
        return f"FlashAttention-2 takes a head dim of at most 256 and a multiple of 8, the plan has {tp.dqk}"
    return None


class AtenBackend(VarlenBackend):
    """Range args on torch.ops.aten's FlashAttention-2 ops, batched per stage as the flash backend is
    (_varlen.py); index args and what FA2 cannot express on the torch kernels (`index="triton"`: index args
    on Triton). `ops`: the object whose `_flash_attention_forward` / `_flash_attention_backward` are called
    (default torch.ops.aten; the CPU tests pass a stand-in with the ops' documented semantics)."""

    name = "aten"
    grads_in_place = False  # the backward op returns its own dQ, dK, dV

    def __init__(self, ops=None, index="torch"):
        super().__init__(index=index)
        self.ops = ops
        self._rng = {}  # device -> the (rng_state, unused) a forward returned: the backward's placeholders

    def graph_key(self):
        return super().graph_key() + (id(self.ops),)

    def _op(self, name):
        return getattr(self.ops if self.ops is not None else torch.ops.aten, name)

    @staticmethod
    def _window_kw(scale, causal, window):
        kw = {"scale": scale}
        if not causal and window != (-1, -1):
            kw["window_size_left"], kw["window_size_right"] = int(window[0]), int(window[1])
        return kw

    def _fwd(self, q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, window):
        out, lse, rng, unused, _ = self._op("_flash_attention_forward")(
            q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False, **self._window_kw(scale, causal, window))
        key = str(q.device)
        if key not in self._rng:
            self._rng[key] = (rng, unused)
        return out, lse.transpose(0, 1)

    def _bwd(self, do, q, k, v, o, lse_hn, cu_q, cu_k, max_q, max_k, scale, causal, window, dq, dk, dv):
        rng = self._rng.get(str(q.device))
        if rng is None:  # no forward ran on this device through this object: the types the ops return
            rng = (torch.empty(2, dtype=torch.uint64, device=q.device), torch.empty((), dtype=torch.uint64,
                                                                                   device=q.device))
        return self._op("_flash_attention_backward")(
            do, q, k, v, o, lse_hn, cu_q, cu_k, max_q, max_k, 0.0, causal, rng[0], rng[1],
            **self._window_kw(scale, causal, window))
