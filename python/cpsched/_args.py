"""Argument checks: each value a ValueError naming its argument, before any C++ is reached."""
from __future__ import annotations

import os

import numpy as np


# The core's bounds (cpsched/base/limits.hpp), checked here so that a bad value is a ValueError naming its
# argument before any C++ is reached (nanobind would raise a TypeError naming none, or wrap around).
_MAX_RANKS = 1 << 20
_MAX_SEQLEN = 1 << 40
_MAX_HEADS = 1 << 16
_MAX_HEAD_DIM = 1 << 16
_MAX_BLOCKS_PER_RANK = 1 << 16
_MAX_DTYPE_BYTES = 16
_INT32_MAX = (1 << 31) - 1


def _int(v, name, lo=None, hi=None):
    """An integer argument: int or numpy integer (never bool, never a float: 4.7 is not silently 4)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"{name}: expected an integer, got {v!r} ({type(v).__name__})")
    v = int(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        lo_s = "-inf" if lo is None else lo
        hi_s = "inf" if hi is None else hi
        raise ValueError(f"{name}: {v} is outside [{lo_s}, {hi_s}]")
    return v


def _bool(v, name):
    """A boolean argument: True or False (or numpy's bool); "no" or 0 are not silently truthy."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    raise ValueError(f"{name}: expected True or False, got {v!r} ({type(v).__name__})")


def _str(v, name):
    if not isinstance(v, str):
        raise ValueError(f"{name}: expected a string, got {v!r} ({type(v).__name__})")
    return v


def _path(v, name):
    if not isinstance(v, (str, os.PathLike)):
        raise ValueError(f"{name}: expected a path (str or os.PathLike), got {v!r} ({type(v).__name__})")
    p = os.fspath(v)
    if isinstance(p, bytes):
        raise ValueError(f"{name}: expected a text path, got bytes {p!r}")
    if not p:
        raise ValueError(f"{name}: an empty path")
    return p


def _folders(v, name):
    """A list of existing folders. A single string is refused (it would be scanned one character at a
    time): wrap it in a list."""
    if isinstance(v, (str, bytes, os.PathLike)):
        raise ValueError(f"{name}: expected a list of folders, got the single path {os.fspath(v)!r}; "
                         f"pass [{os.fspath(v)!r}]")
    try:
        items = list(v)
    except TypeError:
        raise ValueError(f"{name}: expected a list of folders, got {v!r} ({type(v).__name__})") from None
    out = []
    for i, p in enumerate(items):
        p = _path(p, f"{name}[{i}]")
        if not os.path.isdir(p):
            what = "no such folder" if not os.path.exists(p) else "not a folder"
            raise ValueError(f"{name}[{i}]: '{p}': {what}")
        out.append(p)
    return out


def _params(v, name):
    if v is None or isinstance(v, dict):
        return v
    raise ValueError(f"{name}: expected a dict of plugin parameters or None, got {v!r} ({type(v).__name__})")


def _env_bool(var, default):
    """A boolean environment variable, parsed strictly: 1/true/yes/on or 0/false/no/off (any case)."""
    v = os.environ.get(var)
    if v is None:
        return default
    t = v.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{var}={v!r}: expected 1, true, yes, on (flattened) or 0, false, no, off (not flattened)")


def _pass(p):
    if not isinstance(p, str) or p not in ("fwd", "bwd"):
        raise ValueError(f"pass_: expected 'fwd' or 'bwd', got {p!r}")
    return p
