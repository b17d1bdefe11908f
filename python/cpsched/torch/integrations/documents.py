"""The documents of one packed sequence and the range masks a model's layers attend with.

A packed batch is one sequence of S tokens holding several documents. Its documents come from the
position ids (transformers' packed-sequence rule: a document starts wherever a position is not its
predecessor's plus one, so positions restart at each document) or from cu_seqlens (document starts, then S).
From the documents, per layer kind, a mask as cpsched's (q_ranges, k_ranges, types): causal inside each
document, a causal sliding window of W keys inside each document (transformers' `sliding_window`: token i
sees keys (i - W, i]), or full (bidirectional) inside each document.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

_FULL, _CAUSAL, _BI_CAUSAL = 0, 1, 3


def _as_int_vector(x, name):
    """A 1-D int64 numpy copy of a tensor / array / list, or a ValueError naming `name`."""
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise ValueError(f"{name}: expected integer token positions, got a tensor of dtype {x.dtype}")
        a = x.detach().to("cpu", torch.int64).numpy()
    else:
        a = np.asarray(x)
        if a.dtype == object or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{name}: expected integers, got an array of dtype {a.dtype}")
        a = a.astype(np.int64)
    return a


def bounds_from_position_ids(position_ids):
    """Document boundaries [0, b1, ..., S] of a packed sequence from its position ids ([S] or [1, S]): a
    document starts at token 0 and wherever position_ids[i] != position_ids[i - 1] + 1 (the rule of
    transformers' packed sequences and of its `sdpa` mask)."""
    a = _as_int_vector(position_ids, "position_ids")
    if a.ndim == 2 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 1:
        raise ValueError(f"position_ids: expected shape [S] or [1, S] (one packed sequence: batch size 1), got "
                         f"shape {tuple(a.shape)}")
    if a.shape[0] == 0:
        raise ValueError("position_ids: the sequence is empty (S = 0)")
    starts = np.flatnonzero(np.diff(a) != 1) + 1
    return np.concatenate([[0], starts, [a.shape[0]]]).astype(np.int64)


def bounds_from_cu_seqlens(cu_seqlens, seqlen=None):
    """Document boundaries from cu_seqlens ([0, end of document 0, ..., S], non-decreasing; empty documents
    are dropped). `seqlen`: the S the last entry must equal (None: any)."""
    a = _as_int_vector(cu_seqlens, "cu_seqlens")
    if a.ndim != 1 or a.shape[0] < 2:
        raise ValueError(f"cu_seqlens: expected a vector [0, ..., S] of at least 2 entries, got shape "
                         f"{tuple(a.shape)}")
    if a[0] != 0:
        raise ValueError(f"cu_seqlens: must start at 0, got {int(a[0])}")
    d = np.diff(a)
    if (d < 0).any():
        i = int(np.flatnonzero(d < 0)[0])
        raise ValueError(f"cu_seqlens: must be non-decreasing, entry {i + 1} = {int(a[i + 1])} < entry {i} = "
                         f"{int(a[i])}")
    if a[-1] <= 0:
        raise ValueError("cu_seqlens: the sequence is empty (S = 0)")
    if seqlen is not None and int(a[-1]) != int(seqlen):
        raise ValueError(f"cu_seqlens: the last entry {int(a[-1])} is not the sequence's S = {int(seqlen)}")
    keep = np.concatenate([[True], d > 0])
    return a[keep].astype(np.int64)


def position_ids_of(bounds):
    """int64 tensor [S]: each token's position inside its document."""
    bounds = np.asarray(bounds, dtype=np.int64)
    S = int(bounds[-1])
    lengths = np.diff(bounds)
    return torch.from_numpy(np.arange(S, dtype=np.int64) - np.repeat(bounds[:-1], lengths))


def document_mask(bounds, window=None, causal=True):
    """(q_ranges [N, 2], k_ranges [N, 2], types [N]) of the documents `bounds`: causal inside each document,
    full (causal=False), or a causal sliding window of `window` keys (token i sees (i - window, i] of its
    document: transformers' sliding_window, flash-attn's window_size (window - 1, 0)). A window at least as
    long as a document is plain causal there, so a window longer than every document gives the causal mask."""
    bounds = np.asarray(bounds, dtype=np.int64)
    starts, ends = bounds[:-1], bounds[1:]
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
            raise ValueError(f"window: a sliding window is a number of keys >= 1, got {window!r}")
        if not causal:
            raise ValueError("window: a sliding window over a bidirectional (is_causal=False) layer is not "
                             "supported; cpsched.torch's transformers integration plans causal windows")
    if window is None or int(window) >= int((ends - starts).max()):
        t = np.full(starts.shape[0], _CAUSAL if causal else _FULL, dtype=np.int32)
        r = np.stack([starts, ends], 1)
        return r, r.copy(), t
    left = int(window) - 1
    n = ends - starts
    whole = n - 1 <= left  # the window reaches back to the document's start from every row: causal
    # per document either one causal slice (whole) or: rows [s, s + left) causal over [s, s + left), then rows
    # [s + left, e) over [s, e) bi_causal (row i sees [i - left, i]); a window of 1 key has no causal head
    head = ~whole & (left > 0)
    q, k, t = [], [], []
    q.append(np.stack([starts[whole], ends[whole]], 1))
    k.append(q[-1])
    t.append(np.full(int(whole.sum()), _CAUSAL, dtype=np.int32))
    q.append(np.stack([starts[head], starts[head] + left], 1))
    k.append(q[-1])
    t.append(np.full(int(head.sum()), _CAUSAL, dtype=np.int32))
    tail = ~whole
    q.append(np.stack([starts[tail] + left, ends[tail]], 1))
    k.append(np.stack([starts[tail], ends[tail]], 1))
    t.append(np.full(int(tail.sum()), _BI_CAUSAL, dtype=np.int32))
    qr, kr, tt = np.concatenate(q), np.concatenate(k), np.concatenate(t)
    order = np.lexsort((qr[:, 1], qr[:, 0]))  # by query start: the slices of a document in row order
    return np.ascontiguousarray(qr[order]), np.ascontiguousarray(kr[order]), np.ascontiguousarray(tt[order])


def mask_digest(q_ranges, k_ranges, types):
    """Bytes that identify a mask (two layers whose masks have equal digests share a plan)."""
    h = hashlib.blake2b(digest_size=16)
    for a in (q_ranges, k_ranges, types):
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return h.digest()
