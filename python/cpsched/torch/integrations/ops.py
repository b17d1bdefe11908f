"""cpsched attention as a custom operator, so that torch.compile traces through a model's attention layers.

Under torch.compile a ContextParallel call is `torch.ops.cpsched.cp_attention`: opaque to the compiler (its
plan lookup, agreement and collectives run when the compiled graph runs), with a fake implementation for
the shapes and a registered backward (`cp_attention_backward`), so a compiled model has no graph break at
its attention layers. Which step's plan a call runs is looked up when it runs (the step at that time); the
backward runs the plan its forward ran: the forward returns a token (a one-element int64 CPU tensor) that
names its call's plan, backend, group and scale among the last calls (LRU), and the backward finds them by it.
"""
from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from typing import Optional, Tuple

import torch

_CONTEXTS = {}     # ContextParallel serial -> weakref (filled when one is made, never while tracing)
_CALLS = OrderedDict()  # token -> (TorchPlan, backend object, Comm, scale): what a backward needs
_CALLS_KEPT = 4096
_TOKENS = itertools.count(1)


_SERIALS = itertools.count(1)
_WINDOW_BITS = 40


def register_context(cp):
    """A serial number for a ContextParallel that the operator's `kind` argument names (weakly held)."""
    n = next(_SERIALS)
    _CONTEXTS[n] = weakref.ref(cp)
    return n


def kind_id(cp, window, causal):
    """The operator's constant `kind` argument: (the ContextParallel's serial, window, causal) in one int64,
    pure arithmetic, so that torch.compile traces it without side effects."""
    w = 0 if window is None else int(window)
    return ((cp._serial_id << _WINDOW_BITS) | w) << 1 | int(bool(causal))


def _kind(k):
    k = int(k)
    causal, w, serial = bool(k & 1), (k >> 1) & ((1 << _WINDOW_BITS) - 1), k >> (_WINDOW_BITS + 1)
    ref = _CONTEXTS.get(serial)
    cp = ref() if ref is not None else None
    if cp is None:
        raise ValueError(f"kind: cpsched attention kind {k} names no live ContextParallel (a graph compiled for "
                         f"another model?)")
    return cp, (w or None), causal


@torch.library.custom_op("cpsched::cp_attention", mutates_args=())
def cp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, position_ids: Optional[torch.Tensor],
                 kind: int, scale: Optional[float], error: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    cp, window, causal = _kind(kind)
    out, lse, call = cp._call(q, k, v, window, causal, scale, position_ids, error or None)
    token = next(_TOKENS)
    _CALLS[token] = call
    while len(_CALLS) > _CALLS_KEPT:
        _CALLS.popitem(last=False)
    return out, lse, torch.tensor([token], dtype=torch.int64)


@cp_attention.register_fake
def _(q, k, v, position_ids, kind, scale, error):
    L, hq = q.shape[0], q.shape[1]
    return (q.new_empty((L, hq, v.shape[2])), q.new_empty((L, hq), dtype=torch.float32),
            torch.empty(1, dtype=torch.int64, device="cpu"))


@torch.library.custom_op("cpsched::cp_attention_backward", mutates_args=())
def cp_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                          dout: torch.Tensor, token: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from .._exec import run_backward
    t = int(token.reshape(-1)[0])
    call = _CALLS.get(t)
    if call is None:
        raise ValueError(f"token: the forward call {t} of this backward is older than the last {_CALLS_KEPT} "
                         f"cpsched attention calls (run the backward of a step before {_CALLS_KEPT} more calls)")
    tp, backend, comm, scale = call
    with torch.no_grad():  # the executor's backward on the call's plan (as the eager autograd Function runs it)
        dq, dk, dv = run_backward(tp.on(q.device), q, k, v, out, lse, dout.contiguous(), backend, comm, scale)
    return dq, dk, dv


@cp_attention_backward.register_fake
def _(q, k, v, out, lse, dout, token):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    out, lse, token = output
    ctx.save_for_backward(q, k, v, out, lse, token)


def _backward(ctx, dout, _dlse, _dtoken):
    q, k, v, out, lse, token = ctx.saved_tensors
    dq, dk, dv = cp_attention_backward(q, k, v, out, lse, dout, token)
    return dq, dk, dv, None, None, None, None


cp_attention.register_autograd(_backward, setup_context=_setup_context)
