"""A solved mask's Result and the plan's records (CalcMeta, CommMeta and their parts)."""
from __future__ import annotations

import numpy as np

from ._args import _INT32_MAX, _bool, _int, _pass, _path, _str
from ._masks import MASK_TYPES


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
    """CommMeta of one rank and pass: `stages[s - 1]` is remote stage s. `remote_qo_rows` / `remote_kv_rows`:
    int64 rows (begin, end, row, group), the global tokens [begin, end) of head group `group` at rows
    [row, row + end - begin) of the rank's remote buffer; filled only in plans whose index rows the executor
    writes (from top-k row runs), else empty."""

    __slots__ = ("stages", "remote_qo_rows", "remote_kv_rows")

    def __init__(self, d):
        self.stages = [StageComm(s) for s in d["stages"]]
        self.remote_qo_rows = d["remote_qo_rows"]
        self.remote_kv_rows = d["remote_kv_rows"]

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
    (0 full, 1 causal, 2 inv_causal, 3 bi_causal), q_buffers / k_buffers (0 local, 1 remote), groups
    (head group, -1: all heads), and for index args (token top-k masks) index_widths (> 0) and
    index_offsets into the pass's index pool (a range arg: width 0, offset -1)."""

    __slots__ = ()

    def __len__(self):
        return len(self._d["mask_types"])

    def to_list(self):
        """The seed's form: [((q_begin, q_end), (k_begin, k_end), mask_type_name), ...]."""
        return [((int(q[0]), int(q[1])), (int(k[0]), int(k[1])), MASK_TYPES[int(t)])
                for q, k, t in zip(self._d["q_ranges"], self._d["k_ranges"], self._d["mask_types"])]


class CalcMeta:
    """CalcMeta of one rank and pass: stage 0's local args and each remote stage's args;
    `deferred_index_entries` > 0: the index args' rows are the executor's to write (a plan from top-k row
    runs), into a pool of that many entries."""

    __slots__ = ("local_attn_args", "remote_attn_args", "deferred_index_entries")

    def __init__(self, d):
        self.local_attn_args = AttnArgs(d["local_attn_args"])
        self.remote_attn_args = [AttnArgs(a) for a in d["remote_attn_args"]]
        self.deferred_index_entries = int(d["deferred_index_entries"])

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

    def program(self, rank, pass_="fwd"):
        """The order `rank` runs the pass in (the plan JSON's `program`, docs/plan_format.md): an int32
        array of rows (op, stage, kind, phase); op 0 cast, 1 wait_cast, 2 compute, 3 reduce, 4 wait_reduces,
        5 merge; kind 0 qo, 1 kv; phase 0 first, 1 forwarding."""
        return self._r.program(self._rank(rank), _pass(pass_))

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
