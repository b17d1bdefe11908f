"""Token top-k masks planned per rank: the rows' checks, and the summaries the ranks all-gather."""
from __future__ import annotations

import numpy as np

from ._args import _INT32_MAX, _MAX_HEADS, _MAX_RANKS, _MAX_SEQLEN, _bool, _int
from ._masks import _host_array


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
