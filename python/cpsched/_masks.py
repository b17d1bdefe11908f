"""Masks as the seed's three lists (Q ranges, K ranges, mask types), checked and converted for the extension."""
from __future__ import annotations

import numpy as np


# The core's MaskType values (also the seed's AttnMaskType order).
MASK_TYPES = ("full", "causal", "inv_causal", "bi_causal")
_TYPE_CODES = {name: i for i, name in enumerate(MASK_TYPES)}
# The seed's enum member names (AttnMaskType.INVCAUSAL, ...).
_TYPE_CODES.update({"invcausal": 2, "bicausal": 3})


def _host_array(x, name):
    """Any array-like on the host as a numpy array, without importing torch."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack__"):  # torch / jax / cupy tensors, numpy >= 1.22 arrays
        try:
            return np.from_dlpack(x)
        except (BufferError, RuntimeError, TypeError, ValueError) as e:
            raise ValueError(f"{name}: cannot read it as a host array through DLPack ({e}); "
                             f"pass a CPU tensor (e.g. .cpu()) or a list") from None
    if hasattr(x, "to_naive_ranges"):  # the seed's AttnRanges
        x = x.to_naive_ranges()
    elif isinstance(x, (list, tuple)) and x and hasattr(x[0], "start") and hasattr(x[0], "end"):
        x = [(r.start, r.end) for r in x]  # a list of the seed's AttnRange
    try:
        return np.asarray(x)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: not an array of integers ({e})") from None


def _ranges(x, name):
    a = _host_array(x, name)
    if a.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if a.ndim != 2 or a.shape[1] != 2:
        raise ValueError(f"{name}: expected N (begin, end) pairs, an array of shape (N, 2), got shape {a.shape}")
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected integer token positions, got dtype {a.dtype}")
    if a.dtype != np.int64 or not a.flags.c_contiguous:
        if a.dtype == np.uint64 and a.max() > np.iinfo(np.int64).max:
            raise ValueError(f"{name}: token position {a.max()} is too large")
        a = np.ascontiguousarray(a, dtype=np.int64)
    return a


def _type_code(t, where):
    v = getattr(t, "value", t)  # the seed's AttnMaskType enum, or any enum
    if isinstance(v, str):
        code = _TYPE_CODES.get(v.lower())
        if code is None:
            raise ValueError(f"{where}: unknown mask type '{v}' (expected one of {', '.join(MASK_TYPES)} "
                             f"or 0-3)")
        return code
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"{where}: a mask type is a name ({', '.join(MASK_TYPES)}) or 0-3, got {v!r}")
    if not 0 <= int(v) <= 3:
        raise ValueError(f"{where}: mask type {int(v)} is not one of 0 full, 1 causal, 2 inv_causal, 3 bi_causal")
    return int(v)


def _types(x, n):
    # One type for every slice (the seed accepts a single AttnMaskType).
    if isinstance(x, (str, int, np.integer)) or hasattr(x, "value"):
        return np.full(n, _type_code(x, "types"), dtype=np.int32)
    if isinstance(x, (list, tuple)):
        if all(type(v) is int for v in x):
            a = np.asarray(x, dtype=np.int64) if x else np.zeros(0, dtype=np.int64)
        else:
            return np.asarray([_type_code(v, f"types[{i}]") for i, v in enumerate(x)], dtype=np.int32)
    else:
        a = _host_array(x, "types")
    if a.ndim != 1:
        raise ValueError(f"types: expected one mask type per slice, an array of shape (N,), got shape {a.shape}")
    if a.dtype.kind not in "iu":
        if a.dtype.kind in "UO":
            return np.asarray([_type_code(v, f"types[{i}]") for i, v in enumerate(a.tolist())], dtype=np.int32)
        raise ValueError(f"types: expected mask type codes 0-3 or names, got dtype {a.dtype}")
    if a.dtype != np.int32 or not a.flags.c_contiguous:
        if a.size and (a.min() < 0 or a.max() > 3):
            bad = int(np.flatnonzero((a < 0) | (a > 3))[0])
            raise ValueError(f"types[{bad}]: mask type {int(a[bad])} is not one of 0 full, 1 causal, 2 inv_causal, "
                             f"3 bi_causal")
        a = np.ascontiguousarray(a, dtype=np.int32)
    return a


def _seed_lists(q_ranges, k_ranges, types):
    """The seed's three lists, checked and converted for the extension."""
    q = _ranges(q_ranges, "q_ranges")
    k = _ranges(k_ranges, "k_ranges")
    if len(q) == 0 and len(k) == 0:
        # An empty workload is an error, as `slices: []` is in a config (nothing to plan).
        raise ValueError("q_ranges, k_ranges: no slice: the mask selects no (query, key) pair, nothing to plan")
    return q, k, _types(types, len(q))
