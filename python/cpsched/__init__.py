"""cpsched from Python: plan attention under context parallelism per layer.

    import cpsched
    s = cpsched.Session(cp_size=8, heads=(64, 8, 128, "bf16"), solver="balanced_bytes")
    r = s.solve(q_ranges, k_ranges, types)      # lists, numpy, DLPack / __array__ objects
    r.calc_meta(rank), r.comm_meta(rank, "bwd"), r.metrics, r.to_json(), r.write_svg("plan.svg")

The seed's Direct Solver API is `cpsched.magi.DynamicAttnSolver`. See docs/python.md.
Bad input raises ValueError, a plugin's own failure RuntimeError, with the CLI's messages.
"""
from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import queue
import threading
import time
import weakref
from collections import namedtuple

import numpy as np

from . import _cpsched

__version__ = _cpsched.__version__

__all__ = [
    "Session", "Result", "TopkSummary", "TopkRowRuns", "CalcMeta", "CommMeta", "StageComm", "GroupCollectiveArg", "AttnArgs",
    "plugins", "plugin_problems", "run", "mask_from_config", "MASK_TYPES", "__version__",
]

# The core's MaskType values (also the seed's AttnMaskType order).
MASK_TYPES = ("full", "causal", "inv_causal", "bi_causal")
_TYPE_CODES = {name: i for i, name in enumerate(MASK_TYPES)}
# The seed's enum member names (AttnMaskType.INVCAUSAL, ...).
_TYPE_CODES.update({"invcausal": 2, "bicausal": 3})
_DTYPE_BYTES = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp32": 4, "float32": 4, "fp8": 1}

# The core's bounds (cpsched/base/limits.hpp), checked here so that a bad value is a ValueError naming its
# argument before any C++ is reached (nanobind would raise a TypeError naming none, or wrap around).
_MAX_RANKS = 1 << 20
_MAX_SEQLEN = 1 << 40
_MAX_HEADS = 1 << 16
_MAX_HEAD_DIM = 1 << 16
_MAX_BLOCKS_PER_RANK = 1 << 16
_MAX_DTYPE_BYTES = 16
_INT32_MAX = (1 << 31) - 1


# ---- argument checks -----------------------------------------------------------------------

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


# ---- input normalisation -------------------------------------------------------------------

def _keys_array(x, name, first_dim):
    """A host array of top-k key positions [first_dim, H_kv, k] of an integer dtype, or a ValueError."""
    a = _host_array(x, name)
    if a.ndim != 3:
        raise ValueError(f"{name}: expected shape [{first_dim}, H_kv, k], got shape {a.shape}")
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected int32 or int64 key positions, got dtype {a.dtype}")
    return a


def _int32_keys(a, name):
    """Key positions as C-contiguous int32 (exact), or a ValueError naming the first value outside int32 with
    its index and value as given (a uint64 2^63 is not -2^63); the C++ side reports the rest (range,
    causality, duplicates) by entry."""
    if a.dtype.itemsize > 4 or a.dtype == np.uint32:
        lo, hi = a.min(), a.max()
        if hi > _INT32_MAX or lo < -(1 << 31):
            flat = int(np.flatnonzero((a.ravel() > _INT32_MAX) | (a.ravel() < -(1 << 31)))[0])
            idx = np.unravel_index(flat, a.shape)
            raise ValueError(f"{name}[{', '.join(str(int(i)) for i in idx)}] = {int(a.ravel()[flat])} is outside "
                             f"int32 (key positions are < 2^31)")
    if a.dtype != np.int32 or not a.flags.c_contiguous:
        a = np.ascontiguousarray(a, dtype=np.int32)  # in range: exact
    return a


_SUMMARY_FIELDS = ("cells", "row_offsets", "rows", "col_offsets", "cols")
_SUMMARY_SHAPES = ("[n, 4]", "[n + 1]", "[m, 2]", "[n + 1]", "[m', 2]")


def _int64_array(x, name, ndim, width=None, shape_text=""):
    """An integer array of `ndim` dimensions (and `width` columns) as C-contiguous int64, or a ValueError naming
    `name`: None, floats, bools and other shapes are refused, never converted."""
    if x is None:
        raise ValueError(f"{name}: None; expected an integer array of shape {shape_text}")
    a = _host_array(x, name)
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected an integer array, got dtype {a.dtype}")
    if a.ndim != ndim or (width is not None and a.shape[1] != width):
        raise ValueError(f"{name}: expected shape {shape_text}, got shape {a.shape}")
    if a.dtype == np.uint64 and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name}: value {int(a.max())} is outside int64")
    return np.ascontiguousarray(a, dtype=np.int64)


def _summary_arrays(arrays, where):
    """A summary's five arrays, checked for type, dtype and shape and made C-contiguous int64 (what the extension
    reads); what they say (ranges, areas, blocks) is checked where the summaries are planned from."""
    if isinstance(arrays, (str, bytes, np.ndarray)) or not isinstance(arrays, (tuple, list)):
        raise ValueError(f"{where}: expected the tuple of 5 arrays of Session.summarize_topk ({', '.join(_SUMMARY_FIELDS)}), "
                         f"got {type(arrays).__name__}")
    if len(arrays) != 5:
        raise ValueError(f"{where}: expected the 5 arrays of Session.summarize_topk ({', '.join(_SUMMARY_FIELDS)}), "
                         f"got {len(arrays)}")
    out = tuple(_int64_array(a, f"{where}: {name}", 2 if i % 2 == 0 else 1, (4 if i == 0 else 2) if i % 2 == 0 else None,
                             shape)
                for i, (a, name, shape) in enumerate(zip(arrays, _SUMMARY_FIELDS, _SUMMARY_SHAPES)))
    n = len(out[0])
    for i in (1, 3):
        if len(out[i]) != n + 1:
            raise ValueError(f"{where}: {_SUMMARY_FIELDS[i]}: {len(out[i])} entries for {n} cells (expected n + 1 = {n + 1})")
    return out


class TopkSummary:
    """One rank's summary of its top-k index rows (Session.summarize_topk): per cell of its query blocks
    (head, query block, key block) the selected pairs, the query rows and the distinct keys, as int64 arrays
    (`arrays`: cells [n, 4], row_offsets [n + 1], rows [m, 2], col_offsets [n + 1], cols [m', 2]). Kilobytes
    where the rows are megabytes; picklable, for an all-gather. `seqlen`, `kv_heads` and `causal` say what it
    was made for (None: not said); a summary of another S, selection heads or causality than the others' or
    the planning Session's is refused by name. Arrays of another dtype or shape are refused here; what they
    say is checked by Session.solve_topk_summaries / solve_topk_runs, on every rank alike."""

    __slots__ = ("rank", "arrays", "seqlen", "kv_heads", "causal")

    def __init__(self, rank, arrays, seqlen=None, kv_heads=None, causal=None):
        self.rank = _int(rank, "TopkSummary: rank", 0, _MAX_RANKS - 1)
        self.arrays = _summary_arrays(arrays, f"TopkSummary(rank={self.rank})")
        self.seqlen = None if seqlen is None else _int(seqlen, "TopkSummary: seqlen", 1, _MAX_SEQLEN)
        self.kv_heads = None if kv_heads is None else _int(kv_heads, "TopkSummary: kv_heads", 1, _MAX_HEADS)
        self.causal = None if causal is None else _bool(causal, "TopkSummary: causal")

    @property
    def nbytes(self):
        return sum(int(a.nbytes) for a in self.arrays)

    def __getstate__(self):
        return (self.rank, self.arrays, self.seqlen, self.kv_heads, self.causal)

    def __setstate__(self, state):
        # (Unpickled from another rank: checked as the constructor checks.)
        state = tuple(state) + (None,) * (5 - len(state))
        TopkSummary.__init__(self, *state[:5])

    def __repr__(self):
        return f"TopkSummary(rank={self.rank}, cells={len(self.arrays[0])}, {self.nbytes} bytes)"


class TopkRowRuns:
    """One rank's top-k rows as what its index args need, without the keys (Session.summarize_topk_runs, or
    cpsched.torch.summarize_topk on the rows' device): `summary`, the rank's TopkSummary (what the ranks
    all-gather), and per range of its cells' rows (a run of queries that select keys in a cell, cells in
    order) the widest row's keys in the cell (`width`) and the run's selected pairs (`area`), int64 arrays.
    Session.solve_topk_runs plans from them; the plan's index rows are then the executor's to write."""

    __slots__ = ("summary", "width", "area", "kv_heads", "causal")

    def __init__(self, summary, width, area, kv_heads, causal=True):
        if not isinstance(summary, TopkSummary):
            raise ValueError(f"TopkRowRuns: summary: expected a TopkSummary, got {type(summary).__name__}")
        self.summary = summary
        self.width = _int64_array(width, "TopkRowRuns: width", 1, shape_text="[runs]")
        self.area = _int64_array(area, "TopkRowRuns: area", 1, shape_text="[runs]")
        if len(self.width) != len(self.area):
            raise ValueError(f"TopkRowRuns: width has {len(self.width)} entries, area {len(self.area)} (one each per run)")
        self.kv_heads = _int(kv_heads, "TopkRowRuns: kv_heads", 1, _MAX_HEADS)
        self.causal = _bool(causal, "TopkRowRuns: causal")
        for field in ("kv_heads", "causal"):  # the summary says what it was made for, for the other ranks' checks
            mine, said = getattr(self, field), getattr(summary, field)
            if said is None:
                setattr(summary, field, mine)
            elif said != mine:
                raise ValueError(f"TopkRowRuns: {field} = {mine!r}, but its summary was made with {field} = {said!r}")

    def __repr__(self):
        return (f"TopkRowRuns(rank={self.summary.rank}, cells={len(self.summary.arrays[0])}, "
                f"runs={len(self.width)})")


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


def _heads(h):
    """(q, kv, dim, dtype_bytes, dim_v, kv_shared). A dict may give MLA's geometry (docs/heads.md):
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
    return q, kv, dim, dtype, dim_v, kv_shared


def _overrides(o):
    """{"key.path": value} or ["key.path=YAML", ...] -> the CLI's --set strings."""
    if o is None:
        return []
    if isinstance(o, dict):
        out = []
        for k, v in o.items():
            if isinstance(v, str):
                text = v  # YAML text, as after --set key=
            elif v is None:
                text = "null"
            else:
                try:
                    text = json.dumps(v)  # JSON is YAML: numbers, booleans, lists and maps
                except TypeError as e:
                    raise ValueError(f"overrides['{k}']: {e}") from None
            out.append(f"{k}={text}")
        return out
    if isinstance(o, (list, tuple)) and all(isinstance(s, str) for s in o):
        return list(o)
    raise ValueError("overrides: expected a dict {'key.path': value} or a list of 'key.path=YAML' strings")


def _stages(s):
    if isinstance(s, str) and s == "auto":
        return 0
    if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)):
        raise ValueError(f"stages: expected a number of remote stages (1-64) or 'auto', got {s!r}")
    return _int(s, "stages", 1, 64)


def _layout(v):
    if not isinstance(v, str) or v not in ("fixed", "planned"):
        raise ValueError(f"layout: expected 'fixed' (the shards stay where the caller holds them) or 'planned' "
                         f"(the solver may re-lay out the tokens), got {v!r}")
    return v


def _uses(v):
    # Python's encoding for the extension: -1 = by the layout, 0 = ahead, n = n attention calls.
    if v is None:
        return -1
    if isinstance(v, str) and v == "ahead":
        return 0
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"uses: expected the attention calls that run each plan (>= 1), 'ahead' or None, got {v!r}")
    return _int(v, "uses", 1, _INT32_MAX)


def _rank(v, cp_size):
    if v is None:
        return -1
    return _int(v, "rank", 0, cp_size - 1)


def _pass(p):
    if not isinstance(p, str) or p not in ("fwd", "bwd"):
        raise ValueError(f"pass_: expected 'fwd' or 'bwd', got {p!r}")
    return p


# ---- results ---------------------------------------------------------------------------------

class _Record:
    """Read-only attribute view of a dict of plan fields (numpy arrays and numbers)."""

    __slots__ = ("_d",)

    def __init__(self, d):
        object.__setattr__(self, "_d", d)

    def __getattr__(self, k):
        try:
            return self._d[k]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no field '{k}'") from None

    def __setattr__(self, k, v):
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __getitem__(self, k):
        return self._d[k]

    def keys(self):
        return self._d.keys()

    def as_dict(self):
        return dict(self._d)

    def __repr__(self):
        inner = ", ".join(f"{k}={v!r}" for k, v in self._d.items())
        return f"{type(self).__name__}({inner})"


class GroupCollectiveArg(_Record):
    """One stage's group-cast (forward direction) / group-reduce (transpose) of one kind on one rank.

    Fields (numpy arrays): input_split_sizes, input_ranges (N, 2), input_groups, dst_indices (a list of
    arrays: the receivers of each input split), output_split_sizes, src_index, output_groups.
    """

    __slots__ = ()

    # The seed's names.
    @property
    def input_split_size_list(self):
        return self._d["input_split_sizes"].tolist()

    @property
    def output_split_size_list(self):
        return self._d["output_split_sizes"].tolist()

    @property
    def dst_indices_list(self):
        return [a.tolist() for a in self._d["dst_indices"]]

    @property
    def src_index_list(self):
        return self._d["src_index"].tolist()


class StageComm(_Record):
    """Communication of one remote stage: token counts, receive offsets, reduce points and the
    GroupCollectiveArg of each kind (qo, kv, and any the plan format adds)."""

    __slots__ = ()

    def __init__(self, d):
        d = {k: GroupCollectiveArg(v) if isinstance(v, dict) else v for k, v in d.items()}
        super().__init__(d)


class CommMeta:
    """CommMeta of one rank and pass: `stages[s - 1]` is remote stage s."""

    __slots__ = ("stages",)

    def __init__(self, stages):
        self.stages = [StageComm(s) for s in stages]

    def __len__(self):
        return len(self.stages)

    # The seed's names.
    @property
    def num_remote_qo_tokens_per_stage(self):
        return [s.num_remote_qo_tokens for s in self.stages]

    @property
    def num_remote_kv_tokens_per_stage(self):
        return [s.num_remote_kv_tokens for s in self.stages]

    @property
    def qo_group_collective_args_list(self):
        return [s.qo for s in self.stages]

    @property
    def kv_group_collective_args_list(self):
        return [s.kv for s in self.stages]

    def __repr__(self):
        return f"CommMeta(stages={self.stages!r})"


class AttnArgs(_Record):
    """Attention calls as parallel arrays: q_ranges and k_ranges (N, 2) in buffer coordinates, mask_types
    (0 full, 1 causal, 2 inv_causal, 3 bi_causal), q_buffers / k_buffers (0 local, 1 remote) and groups
    (head group, -1: all heads)."""

    __slots__ = ()

    def __len__(self):
        return len(self._d["mask_types"])

    def to_list(self):
        """The seed's form: [((q_begin, q_end), (k_begin, k_end), mask_type_name), ...]."""
        return [((int(q[0]), int(q[1])), (int(k[0]), int(k[1])), MASK_TYPES[int(t)])
                for q, k, t in zip(self._d["q_ranges"], self._d["k_ranges"], self._d["mask_types"])]


class CalcMeta:
    """CalcMeta of one rank and pass: stage 0's local args and each remote stage's args."""

    __slots__ = ("local_attn_args", "remote_attn_args")

    def __init__(self, d):
        self.local_attn_args = AttnArgs(d["local_attn_args"])
        self.remote_attn_args = [AttnArgs(a) for a in d["remote_attn_args"]]

    # The seed's names.
    @property
    def local_attn_arg(self):
        return self.local_attn_args

    @property
    def remote_attn_args_list(self):
        return self.remote_attn_args

    def __repr__(self):
        return f"CalcMeta(local_attn_args={self.local_attn_args!r}, remote_attn_args={self.remote_attn_args!r})"


class Result:
    """One solved mask: plan, assignment and metrics, shared with the Session's cache (valid after
    the Session is gone)."""

    __slots__ = ("_r", "_metrics")

    def __init__(self, r):
        self._r = r
        self._metrics = None

    def _rank(self, rank):
        return _int(rank, "rank", 0, int(self._r.cp_size) - 1)

    def calc_meta(self, rank, pass_="fwd"):
        return CalcMeta(self._r.calc_meta(self._rank(rank), _pass(pass_)))

    def comm_meta(self, rank, pass_="fwd"):
        return CommMeta(self._r.comm_meta(self._rank(rank), _pass(pass_)))

    @property
    def metrics(self):
        """Exact metrics: fwd / bwd {send, recv (bytes per rank), total_send, bottleneck}, load,
        stage0_load, imbalance, stage0_share, remote_qo_tokens, remote_kv_tokens."""
        if self._metrics is None:
            self._metrics = self._r.metrics()
        return self._metrics

    def predicted_compute(self, rank, hardware=None):
        """The timing model's compute seconds of `rank`'s attention args, {"fwd": s, "bwd": s}: the
        profile's kernel model where it has one (tiles, rates by mask form and length), else FLOPs at its
        peak rate; what a runtime's benchmark prints beside the time it measures. `hardware`: a bundled
        profile name or a YAML path; None: the profile the plan was made on (the time cost model's)."""
        hardware = None if hardware is None else _str(hardware, "hardware")
        return self._r.predicted_compute(self._rank(rank), hardware)

    def index_rows(self, rank, pass_="fwd"):
        """The index pool of `rank`'s pass (the plan JSON's `indices`) as an int32 array; empty for range
        masks and for plans whose index rows the executor writes."""
        return self._r.index_rows(self._rank(rank), _pass(pass_))

    def to_json(self, indent=None, solve_ms=None, tasks=True, index_rows=True):
        """The plan JSON (format cpsched-plan/1), byte for byte what `cpsched plan -o` writes for the
        same plan. `solve_ms` replaces the measured solver time (e.g. to compare two exports). `tasks` and
        `index_rows` False leave out the per-task list and the index pools (see index_rows())."""
        if solve_ms is not None:
            if isinstance(solve_ms, (bool, np.bool_)) or not isinstance(solve_ms, (int, float, np.integer, np.floating)) \
                    or not np.isfinite(solve_ms):
                raise ValueError(f"solve_ms: expected a finite number of milliseconds or None, got {solve_ms!r}")
            solve_ms = float(solve_ms)
        return self._r.to_json(-1 if indent is None else _int(indent, "indent", 0, 64), solve_ms,
                               _bool(tasks, "tasks"), _bool(index_rows, "index_rows"))

    def write_svg(self, path, groups=None, title=None, max_groups=None):
        """Draws the Q x KV grid coloured by computing rank (as `cpsched plan --svg`); returns the path."""
        path = _path(path, "path")
        if groups is None:
            groups = []
        elif isinstance(groups, (str, bytes)) or not hasattr(groups, "__iter__"):
            raise ValueError(f"groups: expected a list of head group numbers, got {groups!r}")
        groups = [_int(g, f"groups[{i}]", 0, _INT32_MAX) for i, g in enumerate(groups)]
        title = "" if title is None else _str(title, "title")
        max_groups = 0 if max_groups is None else _int(max_groups, "max_groups", 1, 16)
        self._r.write_svg(path, groups, title, max_groups)
        return path

    def validate(self):
        """The plan validator's problems (an empty list: valid)."""
        return self._r.validate()

    @property
    def task_ranks(self):
        """The computing rank of every task of the grid."""
        return self._r.task_ranks()

    cached = property(lambda self: self._r.cached, doc="True when this solve was a plan-cache hit")
    call_ms = property(lambda self: self._r.call_ms, doc="C++ wall time of the solve call (look-up or solve+plan)")
    solve_ms = property(lambda self: self._r.solve_ms, doc="solver time of the original solve")
    plan_ms = property(lambda self: self._r.plan_ms, doc="plan build time of the original solve")
    num_stages = property(lambda self: self._r.num_stages)
    # The last stage is a local tail (docs/plan_format.md): it moves nothing, counted in num_stages.
    local_tail = property(lambda self: self._r.local_tail)
    cp_size = property(lambda self: self._r.cp_size)
    seqlen = property(lambda self: self._r.seqlen)
    num_tasks = property(lambda self: self._r.num_tasks)
    feasible = property(lambda self: self._r.feasible)
    note = property(lambda self: self._r.note)
    solver = property(lambda self: self._r.solver)
    layout = property(lambda self: self._r.layout,
                      doc="'fixed' (the caller's shards) or 'planned' (dispatch the inputs as host_ranges say)")
    rank = property(lambda self: self._r.rank,
                    doc="the rank whose plan alone was built (Session(rank=...)), or None: every rank's")
    host_ranges = property(lambda self: self._r.host_ranges,
                           doc="per rank, the global (begin, end) token ranges it holds during the call")

    def __repr__(self):
        m = self.metrics
        return (f"<cpsched.Result {self.solver} P={self.cp_size} S={self.seqlen} stages={self.num_stages} "
                f"fwd send={m['fwd']['total_send']} imbalance={m['imbalance']:.3f}"
                f"{' cached' if self.cached else ''}>")


# ---- sessions ----------------------------------------------------------------------------------

def _seed_lists(q_ranges, k_ranges, types):
    """The seed's three lists, checked and converted for the extension."""
    q = _ranges(q_ranges, "q_ranges")
    k = _ranges(k_ranges, "k_ranges")
    if len(q) == 0 and len(k) == 0:
        # An empty workload is an error, as `slices: []` is in a config (nothing to plan).
        raise ValueError("q_ranges, k_ranges: no slice: the mask selects no (query, key) pair, nothing to plan")
    return q, k, _types(types, len(q))


def _resolve(fut, handle):
    try:
        fut.set_result(Result(handle.get()))
    except BaseException as e:  # the solver's error belongs to the Future
        fut.set_exception(e)


def _run_callback(fn, fut):
    try:
        fn(fut)
    except Exception:  # as concurrent.futures does with a callback's error
        logging.getLogger("concurrent.futures").exception("exception calling callback for %r", fut)


class _AheadFuture(concurrent.futures.Future):
    """solve_async's Future. Its done-callbacks run on a thread of their own, never on the Session's one
    resolving thread: a callback that waits for another solve_async of the same Session (or solves more)
    would otherwise hold the very thread that must resolve it, and wait forever. A callback added once the
    Future is done runs at once in the caller's thread, as with any Future."""

    def add_done_callback(self, fn):
        if self.done():
            return super().add_done_callback(fn)  # (runs it now, here)
        super().add_done_callback(lambda f: threading.Thread(target=_run_callback, args=(fn, f),
                                                             name="cpsched-ahead-callback", daemon=True).start())


class _AheadWaiter:
    """One daemon thread per Session that resolves solve_async's Futures in the order the masks were queued
    (the C++ queue solves them in that order); it holds no reference to the Session and ends after the
    Session is collected (the Futures still waiting then fail: the Session closed)."""

    def __init__(self):
        self._q = queue.SimpleQueue()
        threading.Thread(target=self._run, name="cpsched-ahead", daemon=True).start()

    def put(self, fut, handle):
        self._q.put((fut, handle))

    def _run(self):
        while True:
            item = self._q.get()
            if item is None:
                return
            # Wait here, not inside the extension: the interpreter's exit ends a daemon thread when it takes the
            # GIL back, and from inside C++ (a blocking get() with the GIL released) that end is std::terminate,
            # the process aborted with an in-flight plan. Sleeping is CPython's own and safe there; a few ms of
            # latency on a Future whose mask takes tens.
            delay = 0.0005
            while not item[1].done():
                time.sleep(delay)
                delay = min(2 * delay, 0.005)
            _resolve(*item)  # (get() of a done solve keeps the GIL)
            del item  # no reference to the last Future or handle while waiting

    def close(self):
        self._q.put(None)


class Session:
    """Loads its solver and cost model plugins once, then solves one mask per call; a repeated mask is
    a plan-cache hit. Separate Sessions may solve on separate threads (the GIL is released while
    solving); one Session serialises its own calls."""

    __slots__ = ("_s", "_ahead", "__weakref__")

    def __init__(self, cp_size=8, seqlen=0, heads=(64, 8, 128, "bf16"), solver="balanced_bytes",
                 solver_params=None, cost_model="area", cost_params=None, stages=1, *,
                 flatten_head_groups=True, blocks_per_rank=1, relay_node_size=0, cache_size=64, plugin_paths=(),
                 validate=False, layout="fixed", uses=None, rank=None, ahead_queue=4):
        """layout: 'fixed' (each rank keeps its sequential shard; what a mask made inside a layer needs) or
        'planned' (the solver may re-lay out the tokens; dispatch the inputs as the plan's host_ranges say).
        uses: attention calls that run each plan, or 'ahead' (made ahead of need); None: 1 when fixed, ahead
        when planned. rank: build only this rank's CalcMeta/CommMeta (every rank solves the same input to the
        same plan); None: every rank's. ahead_queue: masks that may wait in solve_async's queue. docs/python.md."""
        hq, hkv, dim, dtype_bytes, dim_v, kv_shared = _heads(heads)
        cp_size = _int(cp_size, "cp_size", 1, _MAX_RANKS)
        self._s = _cpsched._Session(cp_size, _int(seqlen, "seqlen", 0, _MAX_SEQLEN),
                                    hq, hkv, dim, dtype_bytes, dim_v, kv_shared,
                                    _bool(flatten_head_groups, "flatten_head_groups"),
                                    _int(blocks_per_rank, "blocks_per_rank", 1, _MAX_BLOCKS_PER_RANK),
                                    _str(solver, "solver"), _params(solver_params, "solver_params"),
                                    _str(cost_model, "cost_model"), _params(cost_params, "cost_params"),
                                    _stages(stages), _int(relay_node_size, "relay_node_size", -1, _MAX_RANKS),
                                    _int(cache_size, "cache_size", 0, _INT32_MAX),
                                    _folders(plugin_paths, "plugin_paths"),
                                    _bool(validate, "validate"), _layout(layout), _uses(uses),
                                    _rank(rank, cp_size), _int(ahead_queue, "ahead_queue", 1, 1 << 20))
        self._ahead = None

    @classmethod
    def from_config(cls, path, overrides=None, *, rank=None):
        """A Session from a YAML config (as `cpsched plan CONFIG --set k=v ...`): problem sizes, solver,
        cost model, stages, cache and plugin paths. `overrides`: {"key.path": value}. `rank`: this process's
        rank of the CP group, as Session(rank=): only its CalcMeta / CommMeta are built (None: every rank's);
        a config is the same on every rank, the rank is not."""
        path = _path(path, "path")
        overrides = _overrides(overrides)
        rank = -1 if rank is None else _int(rank, "rank", 0, _MAX_RANKS - 1)
        self = cls.__new__(cls)
        try:
            self._s = _cpsched._Session.from_config(path, overrides, rank)
        except ValueError as e:
            if rank >= 0 and "session: rank must be" in str(e):
                raise ValueError(f"rank: {rank} is outside [0, cp_size) of the config ({e})") from None
            raise
        self._ahead = None
        return self

    def solve(self, q_ranges, k_ranges, types):
        """Solves one mask given as the seed's three lists: global (begin, end) token ranges of Q and K
        and one mask type per slice (a name, 0-3, the seed's AttnMaskType, or one for all slices)."""
        # The Session keeps no Python reference to its results: a plan is freed when the caller drops
        # it (or the cache evicts it), never inside the next solve call.
        return Result(self._s.solve(*_seed_lists(q_ranges, k_ranges, types)))

    def solve_async(self, q_ranges, k_ranges, types):
        """Plans a mask ahead of need (step t + 1's while step t runs) on the Session's background thread;
        returns a concurrent.futures.Future of its Result. The result lands in the plan cache, so a later
        solve() of the same mask is a cache hit (one still in flight waits for it instead of solving again).
        Identical masks in flight are solved once; a full queue (ahead_queue) makes this call wait for a slot.
        Mask errors raise here; the solver's are the Future's exception. Done-callbacks run on a thread of
        their own (one per callback), so a callback may wait for another of this Session's Futures."""
        handle = self._s.solve_async(*_seed_lists(q_ranges, k_ranges, types))
        fut = _AheadFuture()
        fut.set_running_or_notify_cancel()
        if handle.done():
            _resolve(fut, handle)
        else:
            if self._ahead is None:
                self._ahead = _AheadWaiter()
                weakref.finalize(self, self._ahead.close)
            self._ahead.put(fut, handle)
        return fut

    def solve_config(self):
        """Solves the config's own mask (Session.from_config), exactly as `cpsched plan` does."""
        return Result(self._s.solve_config())

    def solve_topk(self, indices, causal=True):
        """Solves a token top-k mask (DSA's indexer output): integer indices of shape [S, H_kv, k]
        (H_kv = 1: shared by every head, else heads.kv), -1 padded; query i of head h attends to the
        keys indices[i, h, :]. A torch tensor on the GPU: call .cpu() first. Not cached (a selection
        changes every step); errors name the first offending entry (docs/masks.md)."""
        causal = _bool(causal, "causal")
        a = _keys_array(indices, "indices", "S")
        S, h_kv, width = (int(x) for x in a.shape)
        o = self._s.options()
        if o["seqlen"] and S != o["seqlen"]:
            raise ValueError(f"indices: {S} rows (S) but the Session's seqlen is {o['seqlen']}; one row per token")
        blocks = o["cp_size"] * o["blocks_per_rank"]
        if S < blocks:
            raise ValueError(f"indices: S = {S} tokens, fewer than the {blocks} blocks of the grid (cp_size "
                             f"{o['cp_size']} x blocks_per_rank {o['blocks_per_rank']}): every rank needs a token")
        if h_kv not in (1, o["heads"][1]):
            raise ValueError(f"indices: {h_kv} selection heads (shape[1]) but heads.kv = {o['heads'][1]}: a "
                             f"selection is shared by every head (1) or one per KV head ({o['heads'][1]})")
        if width == 0 or a.size == 0:
            raise ValueError(f"indices: shape {a.shape} selects no (query, key) pair: nothing to plan")
        return Result(self._s.solve_topk(_int32_keys(a, "indices"), causal))

    def summarize_topk(self, rows, causal=True):
        """This rank's summary of its own top-k rows (per-rank ingestion, docs/masks.md): `rows` are the
        indexer's output for the queries this rank hosts in the sequential layout, [S/P, H_kv, k], -1 padded,
        global key positions. No collective: gather the P summaries (they are picklable; e.g.
        torch.distributed.all_gather_object) and pass them to solve_topk_summaries. Needs the Session's rank
        and seqlen. Errors name the row of `rows` and its query token."""
        a = self._own_rows(rows, causal)
        o = self._s.options()
        return TopkSummary(o["rank"], self._s.summarize_topk(a, causal), seqlen=o["seqlen"], kv_heads=a.shape[1],
                           causal=causal)

    def solve_topk_summaries(self, summaries, rows, causal=True):
        """This rank's plan of a top-k mask from every rank's TopkSummary (in rank order) and its own rows
        (those it summarised): its part of the plan only, with every query on its host (owner's placement,
        whatever the Session's solver: a rank holds only its own queries' indices). Nothing of size S x k
        crosses between ranks. Not cached. The gathered summaries are checked before this rank's rows, so
        every rank that gathered the same ones raises the same error for a bad one (naming its rank)."""
        self._topk_session()
        _bool(causal, "causal")
        self._check_summaries(summaries, causal)
        a = self._own_rows(rows, causal)
        return Result(self._s.solve_topk_summaries([x.arrays for x in summaries], a, causal))

    def summarize_topk_runs(self, rows, causal=True):
        """This rank's TopkRowRuns of its own top-k rows (as summarize_topk, plus per run of each cell's rows
        its widest row and pairs), counted on the host; cpsched.torch.summarize_topk counts the same on the
        rows' device."""
        a = self._own_rows(rows, causal)
        o = self._s.options()
        cells, width, area = self._s.summarize_topk_runs(a, causal)
        return TopkRowRuns(TopkSummary(o["rank"], cells, seqlen=o["seqlen"]), width, area, a.shape[1], causal)

    def solve_topk_runs(self, summaries, runs):
        """This rank's plan of a top-k mask from every rank's TopkSummary (in rank order) and its own
        TopkRowRuns: as solve_topk_summaries, but the host never reads the rank's keys. The plan's index args
        have their shapes; their rows are the executor's to write (calc `deferred_index_entries`, comm
        `remote_kv_rows`; cpsched.torch does it on the device, docs/plan_format.md). Not cached."""
        self._topk_session()
        if not isinstance(runs, TopkRowRuns):
            raise ValueError(f"runs: expected a TopkRowRuns (Session.summarize_topk_runs), got {type(runs).__name__}")
        self._check_summaries(summaries, runs.causal)
        if runs.summary.rank != self._s.options()["rank"]:
            raise ValueError(f"runs: they are rank {runs.summary.rank}'s, this Session is rank "
                             f"{self._s.options()['rank']}'s")
        return Result(self._s.solve_topk_runs([x.arrays for x in summaries], runs.summary.arrays, runs.width,
                                              runs.area, runs.kv_heads, runs.causal))

    def _topk_session(self):
        o = self._s.options()
        if o["rank"] is None:
            raise ValueError("session: per-rank top-k summaries need the Session's rank (Session(..., rank=r))")
        if not o["seqlen"]:
            raise ValueError("session: per-rank top-k summaries need the Session's seqlen (S)")
        return o

    def _check_summaries(self, summaries, causal):
        """The gathered summaries' list, ranks and what they were made for: the same checks, in the same order,
        on every rank (nothing of this rank's own rows is read here)."""
        o = self._s.options()
        P = o["cp_size"]
        if not isinstance(summaries, (list, tuple)) or len(summaries) != P:
            n = len(summaries) if isinstance(summaries, (list, tuple)) else type(summaries).__name__
            raise ValueError(f"summaries: expected a list of the {P} ranks' TopkSummary (rank order), got {n}")
        for r, x in enumerate(summaries):
            if not isinstance(x, TopkSummary):
                raise ValueError(f"summaries[{r}]: expected a TopkSummary (Session.summarize_topk), got "
                                 f"{type(x).__name__}")
            if x.rank != r:
                raise ValueError(f"summaries[{r}]: it is rank {x.rank}'s summary; the list must be in rank order")
        # What each was made for (where it says): the same for all, and this Session's and this call's.
        for field, mine in (("seqlen", o["seqlen"]), ("kv_heads", None), ("causal", causal)):
            said = [(r, getattr(x, field)) for r, x in enumerate(summaries) if getattr(x, field) is not None]
            if not said:
                continue
            r0, v0 = said[0]
            for r, v in said[1:]:
                if v != v0:
                    raise ValueError(f"summaries[{r}] (rank {r}'s top-k summary): made with {field} = {v!r}, "
                                     f"summaries[{r0}] (rank {r0}'s) with {field} = {v0!r}: the ranks summarised "
                                     f"different masks")
            if field == "kv_heads" and v0 not in (1, o["heads"][1]):
                raise ValueError(f"summaries: made for {v0} selection heads, but heads.kv = {o['heads'][1]} (a "
                                 f"selection is shared by every head, 1, or one per KV head)")
            if mine is not None and v0 != mine:
                what = "this Session's seqlen" if field == "seqlen" else "this call's causal"
                raise ValueError(f"summaries: made with {field} = {v0!r} (summaries[{r0}]), but {what} is {mine!r}")

    def _own_rows(self, rows, causal):
        _bool(causal, "causal")
        o = self._topk_session()
        a = _keys_array(rows, "rows", "rows")
        lo, hi = (int(x) for x in _cpsched.sharding_ranges(o["seqlen"], o["cp_size"])[o["rank"]])
        if a.shape[0] != hi - lo:
            raise ValueError(f"rows: rank {o['rank']} hosts the {hi - lo} tokens [{lo}, {hi}) of S = {o['seqlen']} "
                             f"in the sequential layout, the rows have {a.shape[0]}")
        if a.shape[1] not in (1, o["heads"][1]):
            raise ValueError(f"rows: {a.shape[1]} selection heads (shape[1]) but heads.kv = {o['heads'][1]}")
        return _int32_keys(a, "rows")

    @property
    def options(self):
        return self._s.options()

    @property
    def cache_stats(self):
        """Plan cache: hits, misses, size, capacity."""
        return self._s.cache_stats()


# ---- module functions --------------------------------------------------------------------------

def plugins(plugin_paths=()):
    """The plugins found (the package's own, CPSCHED_PLUGIN_PATH and `plugin_paths`): name, kind, doc,
    file and parameters (name, type, default, doc) of each."""
    return _cpsched.plugins(_folders(plugin_paths, "plugin_paths"))


def plugin_problems(plugin_paths=()):
    """Why each plugin file that could not be loaded was rejected."""
    return _cpsched.plugin_problems(_folders(plugin_paths, "plugin_paths"))


def run(config, overrides=None):
    """`cpsched run CONFIG`: solve, build the plan, execute it with the config's executor. Returns
    {passed, figures (name -> value, in the executor's order), text, svg, executor, result}."""
    out = _cpsched.run(_path(config, "config"), _overrides(overrides))
    out["result"] = Result(out["result"])
    return out


Mask = namedtuple("Mask", "q_ranges k_ranges types seqlen")


def mask_from_config(config, overrides=None):
    """The mask a config describes, as arrays for Session.solve: Mask(q_ranges, k_ranges, types, seqlen)."""
    q, k, t, s = _cpsched.mask_from_config(_path(config, "config"), _overrides(overrides))
    return Mask(q, k, t, s)


def default_plugin_dir():
    """The folder the package's plugins are loaded from."""
    return _cpsched.default_plugin_dir()
