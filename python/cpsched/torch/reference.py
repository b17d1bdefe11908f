"""Single-process dense attention with a boolean mask: the reference the distributed call is checked against
(tests, the training example). O(S^2) memory: for small S only."""
from __future__ import annotations

import math

import torch

_CODES = {"full": 0, "causal": 1, "inv_causal": 2, "bi_causal": 3}


def slice_mask(mask, qb, qe, kb, ke, t):
    """Sets the entries of one slice (global ranges, type code or name) in a boolean [S, S] matrix."""
    t = _CODES.get(t, t) if isinstance(t, str) else int(t)
    lq, lk = qe - qb, ke - kb
    if lq <= 0 or lk <= 0:
        return mask
    i = torch.arange(lq).unsqueeze(1)
    j = torch.arange(lk).unsqueeze(0)
    d = lk - lq
    if t == 0:
        m = torch.ones(lq, lk, dtype=torch.bool)
    elif t == 1:
        m = j <= i + d
    elif t == 2:
        m = j >= i
    else:
        m = (j >= i) & (j <= i + d)
    mask[qb:qe, kb:ke] |= m
    return mask


def mask_matrix(q_ranges, k_ranges, types, seqlen):
    """bool [S, S]: the union of the slices (global token ranges, mask types)."""
    m = torch.zeros(seqlen, seqlen, dtype=torch.bool)
    types = list(types) if hasattr(types, "__len__") else [types] * len(q_ranges)
    for (qb, qe), (kb, ke), t in zip(q_ranges, k_ranges, types):
        slice_mask(m, int(qb), int(qe), int(kb), int(ke), t)
    return m


def plan_mask(plan_json):
    """bool [H, S, S] (H = 1, or one per KV head for head_masks) from a plan JSON's `problem` (range masks and
    block selections; a token top-k plan does not carry its indices: use topk_matrix)."""
    pr = plan_json["problem"]
    S = int(pr["seqlen"])
    heads = pr.get("head_masks")
    if heads:
        out = torch.zeros(len(heads), S, S, dtype=torch.bool)
        for h, sl in enumerate(heads):
            for x in sl:
                slice_mask(out[h], x["q"][0], x["q"][1], x["k"][0], x["k"][1], x["type"])
        return out
    m = torch.zeros(1, S, S, dtype=torch.bool)
    for x in pr["mask"]:
        slice_mask(m[0], x["q"][0], x["q"][1], x["k"][0], x["k"][1], x["type"])
    return m


def topk_matrix(indices):
    """bool [H_kv, S, S] of a token top-k selection [S, H_kv, k] (-1 padded)."""
    idx = torch.as_tensor(indices).long()
    S, H, _ = idx.shape
    m = torch.zeros(H, S, S + 1, dtype=torch.bool)
    rows = torch.arange(S).view(S, 1).expand_as(idx[:, 0])
    for h in range(H):
        col = idx[:, h].clone()
        col[col < 0] = S
        m[h][rows, col] = True
    return m[:, :, :S].contiguous()


def dense_attention(q, k, v, mask, scale=None):
    """q [S, hq, dqk], k [S, hkv, dqk], v [S, hkv, dv], mask bool [S, S] or [H, S, S] (H = 1 or hkv, one per
    KV head) -> O [S, hq, dv]; a row with no unmasked entry gives O = 0. Differentiable (autograd)."""
    S, hq, dqk = q.shape
    hkv = k.shape[1]
    r = hq // hkv
    scale = 1.0 / math.sqrt(dqk) if scale is None else scale
    if mask.dim() == 2:
        mask = mask.unsqueeze(0)
    mask = mask.to(q.device)
    if mask.shape[0] == 1:
        mask = mask.expand(hkv, S, S)
    qh = q.view(S, hkv, r, dqk).permute(1, 2, 0, 3)           # [hkv, r, S, d]
    kh = k.permute(1, 0, 2).unsqueeze(1)                      # [hkv, 1, S, d]
    vh = v.permute(1, 0, 2).unsqueeze(1)
    s = torch.matmul(qh, kh.transpose(-1, -2)) * scale        # [hkv, r, S, S]
    m = mask.unsqueeze(1)
    s = s.masked_fill(~m, float("-inf"))
    alive = m.any(-1, keepdim=True)
    p = torch.softmax(torch.where(alive, s, torch.zeros_like(s)), dim=-1) * alive
    o = torch.matmul(p, vh)                                   # [hkv, r, S, dv]
    return o.permute(2, 0, 1, 3).reshape(S, hq, v.shape[-1])
