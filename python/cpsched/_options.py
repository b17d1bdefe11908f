"""A Session's options (heads, plan shape, layout, uses, rank), checked and converted into _Session's keywords
(named as the C++ SessionOptions' fields)."""
from __future__ import annotations

import numpy as np

from ._args import _INT32_MAX, _MAX_DTYPE_BYTES, _MAX_HEAD_DIM, _MAX_HEADS, _MAX_RANKS, _bool, _int


_DTYPE_BYTES = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp32": 4, "float32": 4, "fp8": 1}


def _heads(h):
    """{q, kv, dim, dtype_bytes, dim_v, kv_shared} (Heads). A dict may give MLA's geometry (docs/heads.md):
    dim_qk (= dim), dim_v (0: dim) and kv_shared (K and V one latent row of dim_qk dims)."""
    dim_v, kv_shared = 0, False
    if isinstance(h, dict):
        unknown = set(h) - {"q", "kv", "dim", "dim_qk", "dim_v", "kv_shared", "dtype"}
        if unknown:
            raise ValueError(f"heads: unknown key(s) {sorted(unknown)} "
                             f"(expected q, kv, dim, dim_qk, dim_v, kv_shared, dtype)")
        if "dim" in h and "dim_qk" in h:
            if _int(h["dim"], "heads['dim']") != _int(h["dim_qk"], "heads['dim_qk']"):
                raise ValueError(f"heads: dim_qk = {h['dim_qk']} differs from dim = {h['dim']}; both name d_qk: "
                                 f"give one of them")
        dim_v = _int(h.get("dim_v", 0), "heads['dim_v']", 0, _MAX_HEAD_DIM)
        kv_shared = _bool(h.get("kv_shared", False), "heads['kv_shared']")
        h = (h.get("q", 64), h.get("kv", 8), h.get("dim", h.get("dim_qk", 128)), h.get("dtype", "bf16"))
    if isinstance(h, (str, bytes)) or not isinstance(h, (tuple, list)):
        raise ValueError(f"heads: expected (q, kv, dim), (q, kv, dim, dtype) or a dict, got {h!r}")
    h = tuple(h)
    if len(h) not in (3, 4):
        raise ValueError(f"heads: expected (q, kv, dim) or (q, kv, dim, dtype), got {h!r}")
    q = _int(h[0], "heads[0] (q)", 1, _MAX_HEADS)
    kv = _int(h[1], "heads[1] (kv)", 1, _MAX_HEADS)
    dim = _int(h[2], "heads[2] (dim)", 1, _MAX_HEAD_DIM)
    if q % kv != 0:
        raise ValueError(f"heads: q = {q} query heads are not a multiple of kv = {kv} key/value heads")
    dtype = h[3] if len(h) == 4 else "bf16"
    if isinstance(dtype, str):
        if dtype not in _DTYPE_BYTES:
            raise ValueError(f"heads: unknown dtype '{dtype}' (expected {', '.join(sorted(_DTYPE_BYTES))} "
                             f"or a size in bytes)")
        dtype = _DTYPE_BYTES[dtype]
    dtype = _int(dtype, "heads[3] (dtype bytes)", 1, _MAX_DTYPE_BYTES)
    return {"q": q, "kv": kv, "dim": dim, "dtype_bytes": dtype, "dim_v": dim_v, "kv_shared": kv_shared}


def _plan_shape(stages, relay_node_size):
    """{stages, relay, node_size} (PlanShape) from Session's stages and relay_node_size: -1, relays where the
    solver finds them faster, on the hardware profile's nodes; 0, none; n, on nodes of n ranks."""
    stages = _stages(stages)
    n = _int(relay_node_size, "relay_node_size", -1, _MAX_RANKS)
    relay = "auto" if n == -1 else "off" if n == 0 else "on"
    return {"stages": stages, "relay": relay, "node_size": max(n, 0)}


def _stages(s):
    if isinstance(s, str) and s == "auto":
        return s
    if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)):
        raise ValueError(f"stages: expected a number of remote stages (1-64) or 'auto', got {s!r}")
    return _int(s, "stages", 1, 64)


def _layout(v):
    if not isinstance(v, str) or v not in ("fixed", "planned"):
        raise ValueError(f"layout: expected 'fixed' (the shards stay where the caller holds them) or 'planned' "
                         f"(the solver may re-lay out the tokens), got {v!r}")
    return v


def _uses(v):
    # None: by the layout (1 when fixed, ahead when planned).
    if v is None or (isinstance(v, str) and v == "ahead"):
        return v
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"uses: expected the attention calls that run each plan (>= 1), 'ahead' or None, got {v!r}")
    return _int(v, "uses", 1, _INT32_MAX)


def _rank(v, cp_size):
    if v is None:  # every rank's plan
        return v
    return _int(v, "rank", 0, cp_size - 1)
