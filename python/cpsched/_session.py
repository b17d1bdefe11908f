"""Session: plugins loaded once, one mask solved per call."""
from __future__ import annotations

import weakref

from . import _cpsched
from ._ahead import _AheadFuture, _AheadWaiter, _resolve
from ._args import (_INT32_MAX, _MAX_BLOCKS_PER_RANK, _MAX_RANKS, _MAX_SEQLEN, _bool, _folders, _int, _params, _path,
                    _str)
from ._config import _overrides
from ._masks import _seed_lists
from ._options import _heads, _layout, _plan_shape, _rank, _uses
from ._result import Result
from ._topk import TopkRowRuns, TopkSummary, _int32_keys, _keys_array


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
        heads = _heads(heads)
        cp_size = _int(cp_size, "cp_size", 1, _MAX_RANKS)
        self._s = _cpsched._Session(
            cp_size=cp_size, seqlen=_int(seqlen, "seqlen", 0, _MAX_SEQLEN), heads=heads,
            grid={"flatten_head_groups": _bool(flatten_head_groups, "flatten_head_groups"),
                  "blocks_per_rank": _int(blocks_per_rank, "blocks_per_rank", 1, _MAX_BLOCKS_PER_RANK)},
            solver=_str(solver, "solver"), solver_params=_params(solver_params, "solver_params"),
            cost_model=_str(cost_model, "cost_model"), cost_params=_params(cost_params, "cost_params"),
            plan=_plan_shape(stages, relay_node_size), cache_size=_int(cache_size, "cache_size", 0, _INT32_MAX),
            plugin_paths=_folders(plugin_paths, "plugin_paths"), validate=_bool(validate, "validate"),
            layout=_layout(layout), uses=_uses(uses), rank=_rank(rank, cp_size),
            ahead_queue=_int(ahead_queue, "ahead_queue", 1, 1 << 20))
        self._ahead = None

    @classmethod
    def from_config(cls, path, overrides=None, *, rank=None):
        """A Session from a YAML config (as `cpsched plan CONFIG --set k=v ...`): problem sizes, solver,
        cost model, stages, cache and plugin paths. `overrides`: {"key.path": value}. `rank`: this process's
        rank of the CP group, as Session(rank=): only its CalcMeta / CommMeta are built (None: every rank's);
        a config is the same on every rank, the rank is not."""
        path = _path(path, "path")
        overrides = _overrides(overrides)
        rank = None if rank is None else _int(rank, "rank", 0, _MAX_RANKS - 1)
        self = cls.__new__(cls)
        try:
            self._s = _cpsched._Session.from_config(path, overrides, rank)
        except ValueError as e:
            if rank is not None and "session: rank must be" in str(e):
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
