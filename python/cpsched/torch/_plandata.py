"""A plan as cpsched.torch reads it, before it is prepared for one rank (_plan.TorchPlan): the problem, the
stage count, the metrics and, per rank entry and pass, its collectives, args, remote rows and program, as
int64 numpy columns. Two sources give the same structures: a Result, through the extension's arrays
(`Result.problem`, `calc_meta` / `comm_meta` with flat=True, `program`, `metrics`: no JSON; a plan of P ranks is
read whole, 2 P passes of a dozen columns each), and a plan's JSON text that
_validate.validate_plan accepted (`TorchPlan.from_json`). The plan digest is computed from them, so a Result and
its own text have the same one.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from . import _program
from ._agree import digest as _digest_of

_TYPE_CODE = {"full": 0, "causal": 1, "inv_causal": 2, "bi_causal": 3}
_I64 = np.int64


class Slices(NamedTuple):
    """A range mask's slices: q_ranges, k_ranges (N x 2) and mask_types (0 full, 1 causal, 2 inv_causal,
    3 bi_causal)."""
    q_ranges: np.ndarray
    k_ranges: np.ndarray
    mask_types: np.ndarray


class Problem(NamedTuple):
    """The plan's problem (docs/plan_format.md "problem"); head_dim_v and kv_shared resolved."""
    cp_size: int
    seqlen: int
    heads_q: int
    heads_kv: int
    head_dim: int
    head_dim_v: int
    kv_shared: bool
    dtype_bytes: int
    head_groups: int
    flatten_head_groups: bool
    blocks_per_rank: int
    host_ranges: tuple        # per rank, ((begin, end), ...)
    layout: str
    mask: Slices
    head_masks: tuple | None  # a Slices per KV head
    index_mask: dict | None   # {causal, kind, kv_heads, shape}
    index_summary: dict | None  # {causal, cells, kv_heads}


class Coll(NamedTuple):
    """One GroupCollectiveArg; dst_indices as receivers `dst[dst_ptr[i]:dst_ptr[i + 1]]` of input split i."""
    sizes: np.ndarray       # input_split_sizes
    ranges: np.ndarray      # input_ranges, N x 2
    groups: np.ndarray      # input_groups
    dst_ptr: np.ndarray
    dst: np.ndarray
    out_sizes: np.ndarray   # output_split_sizes
    src: np.ndarray         # src_index
    out_groups: np.ndarray  # output_groups


class StageComm(NamedTuple):
    num_remote_qo_tokens: int
    num_remote_kv_tokens: int
    qo_recv_offset: int
    kv_recv_offset: int
    qo_reduce_after: int
    kv_reduce_after: int
    qo: Coll
    kv: Coll
    qo_fwd: Coll | None  # None: this rank has no forwarding phase of the kind in the stage
    kv_fwd: Coll | None


class Args(NamedTuple):
    """A list of attention args as columns: q, k (N x 2), type code, q / k in the remote buffer (0, 1), head
    group, and an index arg's index_offset / index_width (-1 / 0 for a range arg)."""
    q: np.ndarray
    k: np.ndarray
    type: np.ndarray
    q_remote: np.ndarray
    k_remote: np.ndarray
    group: np.ndarray
    index_offset: np.ndarray
    index_width: np.ndarray


# A pass's comm and args as the extension's flat int64 columns (Result.comm_meta / calc_meta with flat=True,
# python/src/module.cpp flat_comm / flat_args); a text's are laid out the same way.
COMM_KEYS = ("stage", "in_ptr", "sizes", "ranges", "groups", "dst_ptr", "dst", "out_ptr", "out_sizes", "src",
             "out_groups")
ARG_KEYS = Args._fields + ("stage_ptr",)
_COLLS = ("qo", "kv", "qo_fwd", "kv_fwd")  # collective c = 4 s + j of stage s


class Pass:
    """One pass of one rank entry: `comm` and `args` (dicts of flat int64 columns, COMM_KEYS and ARG_KEYS),
    deferred_index_entries, remote_rows (kind -> int64 rows (begin, end, row, group), CommMeta::remote_*_rows),
    program (int64 rows (op, stage, kind, phase), Result.program's) and, from a text, the index pool (a
    Result's is read per rank: PlanData.index_pool). `stages`, `local` and `remote` are views of it."""

    __slots__ = ("comm", "args", "deferred_index_entries", "remote_rows", "program", "indices", "_stages")

    def __init__(self, comm, args, deferred_index_entries, remote_rows, program, indices):
        self.comm = comm
        self.args = args
        self.deferred_index_entries = deferred_index_entries
        self.remote_rows = remote_rows
        self.program = program
        self.indices = indices
        self._stages = None

    @property
    def num_stages(self):
        return len(self.comm["stage"])

    @property
    def stages(self):
        """A StageComm per remote stage (views of the columns)."""
        if self._stages is None:
            c = self.comm
            self._stages = tuple(StageComm(*(int(x) for x in row), *(self._coll(4 * s + j) for j in range(4)))
                                 for s, row in enumerate(c["stage"].tolist()))
        return self._stages

    def _coll(self, i):
        c = self.comm
        a, b = int(c["in_ptr"][i]), int(c["in_ptr"][i + 1])
        o, p = int(c["out_ptr"][i]), int(c["out_ptr"][i + 1])
        if i % 4 >= 2 and a == b and o == p:
            return None  # no forwarding phase of this kind on this rank (the plan JSON has no such key)
        ptr = c["dst_ptr"][a:b + 1]
        return Coll(c["sizes"][a:b], c["ranges"][a:b], c["groups"][a:b], ptr - ptr[0], c["dst"][ptr[0]:ptr[-1]],
                    c["out_sizes"][o:p], c["src"][o:p], c["out_groups"][o:p])

    def _args(self, s):
        a = self.args
        lo, hi = int(a["stage_ptr"][s]), int(a["stage_ptr"][s + 1])
        return Args(*(a[k][lo:hi] for k in Args._fields))

    @property
    def local(self):
        """Stage 0's args."""
        return self._args(0)

    @property
    def remote(self):
        """Each remote stage's args."""
        return tuple(self._args(s) for s in range(1, len(self.args["stage_ptr"]) - 1))

    def sending(self):
        """bool N x 4: whether this rank sends rows in each stage's (qo, kv, qo_fwd, kv_fwd) collective."""
        c = self.comm
        n = self.num_stages
        counts = np.diff(c["in_ptr"])
        owner = np.repeat(np.arange(4 * n), counts)
        out = np.zeros(4 * n, dtype=bool)
        out[owner[c["sizes"] != 0]] = True
        return out.reshape(n, 4)


class Entry(NamedTuple):
    """One entry of the plan's ranks: every rank's, or a rank's own plan's one."""
    rank: int
    fwd: Pass
    bwd: Pass


class PlanData:
    """A whole plan (every entry it lists) from a Result or a validated text."""

    __slots__ = ("solver", "problem", "num_stages", "local_tail", "metrics", "entries", "per_rank", "result",
                 "_active", "_digest")

    def __init__(self, solver, problem, num_stages, local_tail, metrics, entries, result):
        self.solver = solver
        self.problem = problem
        self.num_stages = num_stages
        self.local_tail = local_tail
        self.metrics = metrics  # {fwd, bwd: {send, recv: [bytes per rank], total_send}}
        self.entries = entries
        # A rank's own plan (Session(rank=r), per-rank top-k summaries) lists only that rank.
        self.per_rank = len(entries) != problem.cp_size
        self.result = result
        self._active = {}
        self._digest = None

    def entry(self, rank):
        if not self.per_rank:
            return self.entries[rank]
        for e in self.entries:
            if e.rank == rank:
                return e
        raise ValueError(f"plan: it holds the plan of rank(s) {[e.rank for e in self.entries]} only, not rank "
                         f"{rank}'s")

    def index_pool(self, rank, pass_):
        """`rank`'s index pool of `pass_` (int64), None when empty: a Result's from the extension (a DSA
        layer's are millions of entries per rank), a text's as parsed."""
        if self.result is not None:
            pool = self.result.index_rows(rank, pass_)
            return pool.astype(np.int64) if len(pool) else None
        pool = getattr(self.entry(rank), pass_).indices
        return pool if pool is not None and len(pool) else None

    def active(self, pass_):
        """Of an all-ranks plan, per remote stage whether some rank sends rows in its (qo, kv, qo_fwd, kv_fwd)
        collective: bool N x 4 (a collective that moves nothing anywhere is skipped on every rank alike)."""
        a = self._active.get(pass_)
        if a is None:
            N = max((getattr(e, pass_).num_stages for e in self.entries), default=0)
            a = np.zeros((N, 4), dtype=bool)
            for e in self.entries:
                mine = getattr(e, pass_).sending()
                a[:len(mine)] |= mine
            self._active[pass_] = a
        return a

    def digest(self):
        """What a rank runs that every rank's copy of the same plan shares: the problem (mask, layout, heads),
        the stages, the programs of every entry and, for a plan of all ranks, every rank's args and
        collectives; for a rank's own plan the reduce points (its splits are matched with the peers' by the
        split digests). The index pools are each rank's own and are left out."""
        if self._digest is None:
            chunks = []
            _feed(chunks, (tuple(self.problem), self.num_stages, self.local_tail))
            # Every entry's passes as one int64 array: each part's length, then the parts' words.
            lengths, parts = [], []

            def add(a):
                lengths.append(a.size)
                parts.append(a.ravel())
            for e in self.entries:
                for pp in (e.fwd, e.bwd):
                    add(_canonical_program(pp.program))
                    if self.per_rank:  # the reduce points, the same on every rank
                        add(pp.comm["stage"][:, 4:6])
                        continue
                    for k in COMM_KEYS:
                        add(pp.comm[k])
                    for k in ARG_KEYS:
                        add(pp.args[k])
                    lengths.append(pp.deferred_index_entries)
                    add(pp.remote_rows["qo"])
                    add(pp.remote_rows["kv"])
            chunks.append(np.array(lengths, dtype=_I64).tobytes())
            chunks.append(np.concatenate(parts).astype(_I64, copy=False).tobytes() if parts else b"")
            self._digest = _digest_of(*chunks)
        return self._digest


def _canonical_program(rows):
    """A program's rows with the fields its op does not read zeroed (kind outside reduce, phase outside cast
    and reduce), so that a Result's rows and its text's parsed ones digest alike."""
    rows = np.array(rows, dtype=_I64).reshape(-1, 4)
    op = rows[:, 0]
    rows[op != _program.OPS.index("reduce"), 2] = 0
    rows[(op != _program.OPS.index("cast")) & (op != _program.OPS.index("reduce")), 3] = 0
    return rows


def _feed(out, x):
    """Appends to `out` the bytes of a nested structure of ints, bools, strings, None, int arrays, tuples /
    lists and dicts, each value tagged with its kind (and arrays with their shape), so that different
    structures differ."""
    if x is None:
        out.append(b"N")
    elif isinstance(x, (bool, np.bool_)):
        out.append(b"T" if x else b"F")
    elif isinstance(x, (int, np.integer)):
        out.append(b"i" + struct.pack("<q", int(x)))
    elif isinstance(x, str):
        b = x.encode()
        out.append(b"s" + struct.pack("<q", len(b)) + b)
    elif isinstance(x, np.ndarray):
        a = np.ascontiguousarray(x, dtype=_I64)
        out.append(b"a" + struct.pack("<q", a.ndim) + np.asarray(a.shape, dtype=_I64).tobytes())
        out.append(a.tobytes())
    elif isinstance(x, dict):
        out.append(b"d" + struct.pack("<q", len(x)))
        for k in sorted(x):
            _feed(out, k)
            _feed(out, x[k])
    elif isinstance(x, (tuple, list)):
        out.append(b"l" + struct.pack("<q", len(x)))
        for v in x:
            _feed(out, v)
    else:
        raise TypeError(f"plan digest: cannot digest a {type(x).__name__}")


def _program_rows(program):
    """A program's instructions (_program.Instr) as rows (op, stage, kind, phase), Result.program's codes."""
    return np.array([(_program.OPS.index(i.op), i.stage, _program.KINDS.index(i.kind), _program.PHASES.index(i.phase))
                     for i in program], dtype=_I64).reshape(-1, 4)


# ---- from a Result (the extension's arrays) ---------------------------------------------------------------

def _i64(a):
    return np.asarray(a, dtype=_I64)  # the extension's arrays are C-contiguous


def _pass_of_result(raw, rank, pass_):
    comm = raw.comm_meta(rank, pass_, flat=True)
    args = raw.calc_meta(rank, pass_, flat=True)
    return Pass({k: comm[k] for k in COMM_KEYS}, {k: args[k] for k in ARG_KEYS}, int(args["deferred_index_entries"]),
                {"qo": comm["remote_qo_rows"], "kv": comm["remote_kv_rows"]},
                _i64(raw.program(rank, pass_)).reshape(-1, 4), None)


def _slices_of_arrays(m):
    return Slices(_i64(m["q_ranges"]).reshape(-1, 2), _i64(m["k_ranges"]).reshape(-1, 2), _i64(m["mask_types"]))


def _problem_of_result(pr):
    hm = pr["head_masks"]
    im = pr["index_mask"]
    return Problem(cp_size=int(pr["cp_size"]), seqlen=int(pr["seqlen"]), heads_q=int(pr["heads_q"]),
                   heads_kv=int(pr["heads_kv"]), head_dim=int(pr["head_dim"]), head_dim_v=int(pr["head_dim_v"]),
                   kv_shared=bool(pr["kv_shared"]), dtype_bytes=int(pr["dtype_bytes"]),
                   head_groups=int(pr["head_groups"]), flatten_head_groups=bool(pr["flatten_head_groups"]),
                   blocks_per_rank=int(pr["blocks_per_rank"]),
                   host_ranges=tuple(tuple((int(b), int(e)) for b, e in rs.tolist()) for rs in pr["host_ranges"]),
                   layout=str(pr["layout"]), mask=_slices_of_arrays(pr["mask"]),
                   head_masks=None if hm is None else tuple(_slices_of_arrays(m) for m in hm),
                   index_mask=None if im is None else _index_mask(im),
                   index_summary=_index_summary(pr["index_summary"]))


def _index_mask(m):
    return {"causal": bool(m["causal"]), "kind": str(m["kind"]), "kv_heads": int(m["kv_heads"]),
            "shape": [int(x) for x in m["shape"]]}


def _index_summary(m):
    if m is None:
        return None
    return {"causal": bool(m["causal"]), "cells": int(m["cells"]), "kv_heads": int(m["kv_heads"])}


def _metrics(m):
    return {p: {"send": [int(x) for x in m[p]["send"]], "recv": [int(x) for x in m[p]["recv"]],
                "total_send": int(m[p]["total_send"])} for p in ("fwd", "bwd")}


def of_result(result):
    """The plan of a cpsched.Result (or the extension's own Result), from the extension's arrays."""
    raw = getattr(result, "_r", result)
    problem = _problem_of_result(raw.problem())
    ranks = range(problem.cp_size) if raw.rank is None else (int(raw.rank),)
    entries = [Entry(r, _pass_of_result(raw, r, "fwd"), _pass_of_result(raw, r, "bwd")) for r in ranks]
    return PlanData(str(raw.solver), problem, int(raw.num_stages), bool(raw.local_tail), _metrics(raw.metrics()),
                    entries, result)


# ---- from a plan's JSON text (validated by _validate.validate_plan) -------------------------------------

def _ranges(lst):
    return np.array(lst, dtype=_I64).reshape(-1, 2)


def _comm_of_text(stages):
    """A text's stages as the flat columns of COMM_KEYS (an absent forwarding phase: an empty collective)."""
    stage, in_ptr, sizes, ranges, groups, dst_ptr, dst, out_ptr, out_sizes, src, out_groups = \
        [], [0], [], [], [], [0], [], [0], [], [], []
    for st in stages:
        stage.append([st["num_remote_qo_tokens"], st["num_remote_kv_tokens"], st["qo_recv_offset"],
                      st["kv_recv_offset"], st["qo_reduce_after"], st["kv_reduce_after"]])
        for key in _COLLS:
            c = st.get(key)
            if c is not None:
                sizes += c["input_split_sizes"]
                ranges += c["input_ranges"]
                groups += c["input_groups"]
                for d in c["dst_indices"]:
                    dst += d
                    dst_ptr.append(len(dst))
                out_sizes += c["output_split_sizes"]
                src += c["src_index"]
                out_groups += c["output_groups"]
            in_ptr.append(len(sizes))
            out_ptr.append(len(out_sizes))
    cols = dict(zip(COMM_KEYS, (stage, in_ptr, sizes, ranges, groups, dst_ptr, dst, out_ptr, out_sizes, src,
                                out_groups)))
    out = {k: np.array(v, dtype=_I64) for k, v in cols.items()}
    out["stage"] = out["stage"].reshape(-1, 6)
    out["ranges"] = out["ranges"].reshape(-1, 2)
    return out


def _args_of_text(calc):
    """A text's args, stage 0's then each remote stage's, as the flat columns of ARG_KEYS."""
    lists = [calc["local_attn_args"]] + list(calc["remote_attn_args"])
    args = [a for lst in lists for a in lst]
    ptr = np.zeros(len(lists) + 1, dtype=_I64)
    np.cumsum([len(lst) for lst in lists], out=ptr[1:])
    return {"q": _ranges([a["q"] for a in args]), "k": _ranges([a["k"] for a in args]),
            "type": np.array([_TYPE_CODE[a["type"]] for a in args], dtype=_I64),
            "q_remote": np.array([a["q_buf"] == "remote" for a in args], dtype=_I64),
            "k_remote": np.array([a["k_buf"] == "remote" for a in args], dtype=_I64),
            "group": np.array([a["group"] for a in args], dtype=_I64),
            "index_offset": np.array([a.get("index_offset", -1) for a in args], dtype=_I64),
            "index_width": np.array([a.get("index_width", 0) for a in args], dtype=_I64),
            "stage_ptr": ptr}


def _program_of_text(mine, entry, pass_):
    texts = mine.get("program")
    if texts is None:
        raise ValueError(f"plan: ranks[{entry}].{pass_}.program: missing (the order the rank runs the pass in; "
                         "Result.to_json writes it)")
    return _program_rows([_program.parse(t) for t in texts])


def _pass_of_text(mine, entry, pass_):
    calc, comm = mine["calc"], mine["comm"]
    pool = calc.get("indices")
    return Pass(_comm_of_text(comm["stages"]), _args_of_text(calc), int(calc.get("deferred_index_entries", 0)),
                {k: np.array(comm.get(f"remote_{k}_rows", []), dtype=_I64).reshape(-1, 4) for k in ("qo", "kv")},
                _program_of_text(mine, entry, pass_), np.array(pool, dtype=_I64) if pool else None)


def _slices_of_text(lst):
    return Slices(_ranges([s["q"] for s in lst]), _ranges([s["k"] for s in lst]),
                  np.array([_TYPE_CODE[s["type"]] for s in lst], dtype=_I64))


def _problem_of_text(pr):
    dqk = int(pr["head_dim"])
    hm = pr.get("head_masks")
    im = pr.get("index_mask")
    return Problem(cp_size=int(pr["cp_size"]), seqlen=int(pr["seqlen"]), heads_q=int(pr["heads_q"]),
                   heads_kv=int(pr["heads_kv"]), head_dim=dqk, head_dim_v=int(pr.get("head_dim_v", dqk)) or dqk,
                   kv_shared=bool(pr.get("kv_shared", False)), dtype_bytes=int(pr["dtype_bytes"]),
                   head_groups=int(pr["head_groups"]), flatten_head_groups=bool(pr["flatten_head_groups"]),
                   blocks_per_rank=int(pr.get("blocks_per_rank", 1)),
                   host_ranges=tuple(tuple((int(b), int(e)) for b, e in rs) for rs in pr["host_ranges"]),
                   layout=str(pr.get("layout", "fixed")), mask=_slices_of_text(pr["mask"]),
                   head_masks=None if hm is None else tuple(_slices_of_text(m) for m in hm),
                   index_mask=None if im is None else _index_mask(im),
                   index_summary=_index_summary(pr.get("index_summary")))


def of_text(d):
    """The plan of a parsed plan JSON that _validate.validate_plan accepted."""
    problem = _problem_of_text(d["problem"])
    P = problem.cp_size
    entries = []
    for i, e in enumerate(d["ranks"]):
        r = int(e.get("rank", i))
        entries.append(Entry(r, _pass_of_text(e["fwd"], i, "fwd"), _pass_of_text(e["bwd"], i, "bwd")))
    # the executor needs no metrics; the byte tests read them (a text may leave them out)
    m = d["metrics"] if "metrics" in d else {p: {"send": [0] * P, "recv": [0] * P, "total_send": 0}
                                             for p in ("fwd", "bwd")}
    try:
        metrics = _metrics(m)
    except (KeyError, TypeError, ValueError):
        raise ValueError("plan: metrics: expected {fwd, bwd: {send, recv, total_send}} (Result.to_json's)") from None
    sv = d.get("solver")
    return PlanData(str(sv.get("name", "?")) if isinstance(sv, dict) else "?", problem, int(d.get("stages", 0)),
                    bool(d.get("local_tail", False)), metrics, entries, None)
