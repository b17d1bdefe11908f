"""The seed's Direct Solver API as a drop-in:

    from cpsched.magi import DynamicAttnSolver          # instead of magi_attention's
    solver = DynamicAttnSolver(algorithm=BinaryGreedyParallelDynamicAttnAlgorithm(),
                               num_heads_q=64, num_heads_kv=8, head_dim=128, cp_group=cp_group,
                               dispatch_meta_q=dispatch_meta_q, dispatch_meta_k=dispatch_meta_k)
    solver.solve(q_ranges, k_ranges, attn_mask_type)
    calc_meta = solver.make_calc_meta(); comm_meta = solver.make_comm_meta()
    solver.output_solve_result(visualize=True, save_path="solver_output.svg")

The algorithm is chosen by solver name: a string ("balanced_bytes", "binary_greedy", ...), an object
with a `name` attribute (the classes below), or the seed's algorithm objects by class name. The rank
and size come from `dispatch_meta_q` (cp_rank, cp_size), else `cp_rank` / `cp_size`, else
`cp_group.rank()` / `cp_group.size()` (a torch ProcessGroup or anything alike). No torch import.
docs/python.md maps every argument and field.
"""
from __future__ import annotations

import os

from . import Session, _cpsched
from ._args import _MAX_HEAD_DIM, _MAX_HEADS, _MAX_RANKS, _MAX_SEQLEN, _bool, _env_bool, _int

__all__ = ["DynamicAttnSolver", "BinaryGreedyParallelDynamicAttnAlgorithm", "BalancedBytesAlgorithm",
           "algorithm_name"]


class _Algorithm:
    name = ""

    def __init__(self, **params):
        self.params = params  # the solver plugin's parameters (cpsched.plugins() lists them)

    def __repr__(self):
        return f"{type(self).__name__}({self.params!r})"


class BinaryGreedyParallelDynamicAttnAlgorithm(_Algorithm):
    """The seed's algorithm (the `binary_greedy` solver plugin)."""
    name = "binary_greedy"


class BalancedBytesAlgorithm(_Algorithm):
    """cpsched's default solver (`balanced_bytes`)."""
    name = "balanced_bytes"


# The seed's algorithm classes, by class name -> our solver plugin.
_SEED_ALGORITHMS = {
    "BinaryGreedyParallelDynamicAttnAlgorithm": "binary_greedy",
    "BinaryGreedyDynamicAttnAlgorithm": "binary_greedy",
}


def algorithm_name(algorithm):
    """The solver plugin an `algorithm` argument selects."""
    if isinstance(algorithm, str):
        return algorithm
    name = getattr(algorithm, "name", None)
    if isinstance(name, str) and name:
        return name
    cls = type(algorithm).__name__
    if cls in _SEED_ALGORITHMS:
        return _SEED_ALGORITHMS[cls]
    raise ValueError(f"algorithm: cannot tell which solver {cls} is; pass a solver name "
                     f"({', '.join(p['name'] for p in _cpsched.plugins() if p['kind'] == 'solver')}) "
                     f"or one of {', '.join(sorted(_SEED_ALGORITHMS))}")


def _flatten_default():
    # The seed reads MAGI_ATTENTION_FLATTEN_HEAD_GROUPS; unset, cpsched's default (flattened) holds. Parsed
    # strictly: "no" or "FALSE" mean False, and anything not a boolean is a ValueError naming the variable.
    return _env_bool("MAGI_ATTENTION_FLATTEN_HEAD_GROUPS", True)


def _group_call(cp_group, what):
    f = getattr(cp_group, what, None)
    if not callable(f):
        raise ValueError(f"cp_group: expected a process group with rank() and size() (a torch ProcessGroup), "
                         f"got {type(cp_group).__name__} without {what}()")
    return f()


def _merged(ranges):
    """(begin, end) pairs of the seed's AttnRanges, a list of AttnRange or pairs, sorted and merged."""
    if hasattr(ranges, "to_naive_ranges"):
        ranges = ranges.to_naive_ranges()
    pairs = sorted((int(r.start), int(r.end)) if hasattr(r, "start") else (int(r[0]), int(r[1])) for r in ranges)
    out = []
    for b, e in pairs:
        if out and b <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        elif e > b:
            out.append((b, e))
    return out


def _meta_attr(meta, name, attr):
    if not hasattr(meta, attr):
        raise ValueError(f"{name}: expected the seed's DispatchMeta (with cp_rank, cp_size, total_seqlen), got "
                         f"{type(meta).__name__} without {attr}")
    return getattr(meta, attr)


def _host_ranges_of(meta):
    hr = getattr(meta, "host_ranges_per_rank", None)
    return None if hr is None else [_merged(r) for r in hr]


class DynamicAttnSolver:
    """The seed's DynamicAttnSolver over a cpsched Session (fixed sequential sharding)."""

    def __init__(self, algorithm, num_heads_q, num_heads_kv, head_dim, cp_group=None, dispatch_meta_q=None,
                 dispatch_meta_k=None, total_seqlen_q=None, total_seqlen_k=None, host_ranges_q=None,
                 host_ranges_k=None, cp_rank=None, cp_size=None, cp_mesh=None, calc_local_range=True, *,
                 dtype="bf16", stages=1, cost_model="area", solver_params=None, cost_params=None,
                 flatten_head_groups=None, relay_node_size=0, cache_size=64, plugin_paths=()):
        num_heads_q = _int(num_heads_q, "num_heads_q", 1, _MAX_HEADS)
        num_heads_kv = _int(num_heads_kv, "num_heads_kv", 1, _MAX_HEADS)
        head_dim = _int(head_dim, "head_dim", 1, _MAX_HEAD_DIM)
        if num_heads_q % num_heads_kv != 0:
            raise ValueError(f"num_heads_q ({num_heads_q}) must be a multiple of num_heads_kv ({num_heads_kv})")
        if dispatch_meta_q is not None:
            cp_rank = _meta_attr(dispatch_meta_q, "dispatch_meta_q", "cp_rank")
            cp_size = _meta_attr(dispatch_meta_q, "dispatch_meta_q", "cp_size")
            total_seqlen_q = _meta_attr(dispatch_meta_q, "dispatch_meta_q", "total_seqlen")
            host_ranges_q = _host_ranges_of(dispatch_meta_q)
        if dispatch_meta_k is not None:
            total_seqlen_k = _meta_attr(dispatch_meta_k, "dispatch_meta_k", "total_seqlen")
            host_ranges_k = _host_ranges_of(dispatch_meta_k)
        if cp_rank is None or cp_size is None:
            if cp_group is None:
                raise ValueError("DynamicAttnSolver: give cp_group (with rank() and size()), dispatch_meta_q, "
                                 "or cp_rank and cp_size")
            cp_rank = _group_call(cp_group, "rank") if cp_rank is None else cp_rank
            cp_size = _group_call(cp_group, "size") if cp_size is None else cp_size
        cp_size = _int(cp_size, "cp_size", 1, _MAX_RANKS)
        cp_rank = _int(cp_rank, "cp_rank")
        if not 0 <= cp_rank < cp_size:
            raise ValueError(f"cp_rank {cp_rank} is outside [0, {cp_size})")
        if total_seqlen_q is not None and total_seqlen_k is not None and total_seqlen_q != total_seqlen_k:
            raise ValueError(f"total_seqlen_q ({total_seqlen_q}) and total_seqlen_k ({total_seqlen_k}) differ; "
                             f"cpsched plans self-attention over one sequence")
        if total_seqlen_q is not None:
            total_seqlen_q = _int(total_seqlen_q, "total_seqlen_q", 0, _MAX_SEQLEN)
        if total_seqlen_k is not None:
            total_seqlen_k = _int(total_seqlen_k, "total_seqlen_k", 0, _MAX_SEQLEN)
        seqlen = total_seqlen_q if total_seqlen_q is not None else (total_seqlen_k or 0)
        # Only fixed sequential sharding (the dynamic solver's layout) is planned: check a given layout.
        for name, hr in (("host_ranges_q", host_ranges_q), ("host_ranges_k", host_ranges_k)):
            if hr is not None:
                self._check_sequential(name, hr, seqlen, cp_size)
        if params := getattr(algorithm, "params", None):
            solver_params = {**params, **(solver_params or {})}
        self.algorithm = algorithm
        self.cp_group = cp_group
        self.cp_mesh = cp_mesh
        self.cp_rank = cp_rank
        self.cp_size = cp_size
        self.num_heads_q = num_heads_q
        self.num_heads_kv = num_heads_kv
        self.head_dim = head_dim
        self.total_seqlen_q = self.total_seqlen_k = seqlen or None
        self.calc_local_range = _bool(calc_local_range, "calc_local_range")
        self.session = Session(cp_size=cp_size, seqlen=seqlen, heads=(num_heads_q, num_heads_kv, head_dim, dtype),
                               solver=algorithm_name(algorithm), solver_params=solver_params,
                               cost_model=cost_model, cost_params=cost_params, stages=stages,
                               flatten_head_groups=_flatten_default() if flatten_head_groups is None
                               else _bool(flatten_head_groups, "flatten_head_groups"),
                               relay_node_size=relay_node_size, cache_size=cache_size,
                               plugin_paths=plugin_paths)
        self.result = None

    @staticmethod
    def _check_sequential(name, host_ranges, seqlen, cp_size):
        if len(host_ranges) != cp_size:
            raise ValueError(f"{name}: {len(host_ranges)} ranks' ranges for cp_size {cp_size}")
        if seqlen <= 0:
            return
        expected = _cpsched.sharding_ranges(seqlen, cp_size)
        for r, ranges in enumerate(host_ranges):
            merged = _merged(ranges)
            if merged != [tuple(int(v) for v in expected[r])]:
                raise ValueError(f"{name}: rank {r} hosts {merged}, but cpsched plans fixed sequential sharding "
                                 f"(rank {r} hosts {tuple(int(v) for v in expected[r])}); dispatch without "
                                 f"reordering")

    def solve(self, q_ranges, k_ranges, attn_mask_type):
        """Solves one layer's mask (the seed's AttnRanges or lists / arrays, and AttnMaskType(s))."""
        self.result = self.session.solve(q_ranges, k_ranges, attn_mask_type)
        return self.result

    @property
    def is_solved(self):
        return self.result is not None

    def _need(self):
        if self.result is None:
            raise ValueError("session: nothing solved yet (call solve first)")
        return self.result

    def make_calc_meta(self, pass_="fwd"):
        """This rank's CalcMeta (cpsched.CalcMeta): local_attn_arg, remote_attn_args_list."""
        return self._need().calc_meta(self.cp_rank, pass_)

    def make_comm_meta(self, pass_="fwd"):
        """This rank's CommMeta (cpsched.CommMeta): num_remote_{qo,kv}_tokens_per_stage,
        {qo,kv}_group_collective_args_list."""
        return self._need().comm_meta(self.cp_rank, pass_)

    def output_solve_result(self, visualize=False, save_path=None, before_dispatch=False):
        """With visualize=True, draws the partition as SVG to save_path (default solver_output.svg; another
        suffix such as the seed's .png is replaced by .svg). Returns the path written, or None."""
        if not _bool(visualize, "visualize"):
            return None
        path = os.fspath(save_path) if save_path is not None else "solver_output.svg"
        root, ext = os.path.splitext(path)
        if ext.lower() != ".svg":
            path = root + ".svg"
        return self._need().write_svg(path, title="DynamicAttnSolver buckets")

    @property
    def metrics(self):
        return self._need().metrics

    def __repr__(self):
        return (f"<cpsched.magi.DynamicAttnSolver {algorithm_name(self.algorithm)} rank {self.cp_rank}/"
                f"{self.cp_size}{' solved' if self.result is not None else ''}>")

