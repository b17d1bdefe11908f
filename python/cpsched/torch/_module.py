"""cpsched.torch.DistAttention: solve each call's mask with a Session (cached), then run it."""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

import torch
import torch.distributed as dist

from .. import Mask
from .._masks import _ranges, _types
from . import _groups
from ._agree import Claim, compare, digest, exchange
from ._api import _attention, _checking, _group_info, prepare
from ._plan import TorchPlan
from ._topk import blocks_of, summarize_topk, write_index_rows


def remap_topk(tp, full, device):
    """Each index arg's rows of this rank in its k buffer, computed with torch ops on `device` from the global
    top-k indices `full` [S, H_kv, k] and the plan's receive layout: query row i of the arg (a global query
    of this rank's local or remote QO rows) selects the keys full[q, h, :] inside the arg's key block, each
    mapped to its row in the local shard or the remote KV buffer (the rows that arrived for the arg's head
    group). Returns the (forward, backward) index pools in the plan's layout (index_offset / index_width per
    arg); a selected key of the block that no row holds raises (the plan would have dropped it)."""
    S, H = int(full.shape[0]), int(full.shape[1])
    full = full.to(device=device, dtype=torch.int64)
    lay = tp.layout
    local_glob = lay.global_index(tp.rank).to(device)
    inv_local = torch.full((S,), -1, dtype=torch.int64, device=device)
    inv_local[local_glob] = torch.arange(local_glob.numel(), device=device)
    # the key blocks of the plan's grid: the sequential shards cut into the plan's blocks per rank (a solver
    # may re-grid: blocks_per_rank is the plan's, not the Session's)
    blocks = blocks_of(tp.seqlen, tp.cp_size, tp.blocks_per_rank)
    starts = torch.tensor([b for b, _ in blocks], dtype=torch.int64)
    ends = {b: e for b, e in blocks}
    pools = []
    for pp in (tp.fwd, tp.bwd):
        if pp.indices is None:
            pools.append(None)
            continue
        qg, _ = (x.to(device) for x in pp.row_global["qo"])
        kg, kh = (x.to(device) for x in pp.row_global["kv"])
        inv_remote = {}
        pool = torch.full((pp.indices.numel(),), -1, dtype=torch.int64, device=device)
        for args in [pp.stage0] + pp.stages:
            for a in args:
                if a.index_width <= 0 or a.q1 <= a.q0:
                    continue
                n, w = a.q1 - a.q0, a.index_width
                gq = (qg if a.q_remote else local_glob)[a.q0:a.q1]
                g = max(a.group, 0)
                sel = full[gq, g if H > 1 else 0]  # [n, k] global keys, -1 padded
                g0 = int((kg if a.k_remote else local_glob)[a.k0])
                lo = int(starts[torch.searchsorted(starts, torch.tensor(g0), right=True) - 1])
                hi = ends[lo]
                if a.k_remote:
                    inv = inv_remote.get(g)
                    if inv is None:
                        inv = torch.full((S,), -1, dtype=torch.int64, device=device)
                        rows = torch.nonzero(kh == g).view(-1)
                        inv[kg[rows]] = rows
                        inv_remote[g] = inv
                else:
                    inv = inv_local
                inblock = (sel >= lo) & (sel < hi)
                rows = torch.where(inblock, inv[sel.clamp(0, S - 1)], torch.full_like(sel, -1))
                if bool((inblock & (rows < 0)).any()):
                    raise ValueError(f"remap_topk: rank {tp.rank} selects keys of [{lo}, {hi}) that its k buffer "
                                     f"does not hold (a plan for other indices?)")
                order = torch.sort((rows < 0).to(torch.int8), dim=1, stable=True).indices
                rows = torch.gather(rows, 1, order)
                if rows.shape[1] > w and bool((rows[:, w:] >= 0).any()):
                    raise ValueError(f"remap_topk: a query of rank {tp.rank} selects more than the plan's {w} keys "
                                     f"in [{lo}, {hi})")
                if rows.shape[1] < w:
                    rows = torch.cat([rows, torch.full((n, w - rows.shape[1]), -1, dtype=torch.int64,
                                                       device=device)], 1)
                pool[a.index_offset:a.index_offset + n * w] = rows[:, :w].reshape(-1)
        pools.append(pool)
    return pools


def _session_digest(session):
    """What else of a Session's options shapes its plans (not its rank, cache and queue sizes, nor what the
    claim names apart: S, P, blocks and heads)."""
    o = dict(session.options)
    for k in ("rank", "cache_size", "ahead_queue", "uses", "seqlen", "cp_size", "blocks_per_rank", "heads", "dim_v",
              "kv_shared"):
        o.pop(k, None)
    return digest(repr(sorted(o.items())))


def _ingest_claim(session, indices, causal, gather, remap, with_k):
    """The fields every rank's ingestion must share: the Session's S, P, blocks, heads and solver, and the
    indices' selection heads (and width where asked). The indices' dtype and width may differ."""
    o = session.options
    c = Claim("ingest_topk")
    c.add("session seqlen (S)", o["seqlen"]).add("session cp_size (P)", o["cp_size"])
    c.add("session blocks_per_rank", o["blocks_per_rank"])
    c.add("session heads", digest(repr(o["heads"]), o.get("dim_v"), o.get("kv_shared")), "digest",
          " (Session heads, d_v or kv_shared)")
    c.add("session options", _session_digest(session), "digest", " (solver, stages, cost model, layout, ...)")
    c.add("indices selection heads (H_kv)", int(indices.shape[1]))
    if with_k:
        c.add("indices width (k)", int(indices.shape[2]))
    c.add("causal", bool(causal), "bool").add("gather", digest(gather), "digest").add("remap", digest(remap), "digest")
    return c


def ingest_topk(indices, session, group=None, causal=True, check_peers=None, remap=None, gather="auto"):
    """A token top-k mask (DSA's indexer output) given as this rank's own rows, solved into a plan.

    `indices`: int32 / int64 [rows, H_kv, k] on any device, -1 padded, global key positions; the rank's rows
    of the sequential layout. `gather` says what the ranks exchange:
      * "summaries": each rank summarises its own rows (per cell of its query blocks the selected pairs, rows
        and distinct keys, kilobytes), one all_gather_object exchanges them, and each rank plans its own part
        from them: nothing of size S x k crosses, every query stays on its host (owner's placement). With
        `remap="device"` (its default) the summary and each run's widest row are counted with torch ops on
        the indices' device (`summarize_topk`), the host plans from them alone (`Session.solve_topk_runs`)
        and the plan's index rows are written on the device (`write_index_rows`): the host never reads the
        keys. `"plan"` copies the rows to the host, which summarises them and writes the plan's index pool
        (`Session.summarize_topk` / `solve_topk_summaries`). Needs the Session's rank (Session(..., rank=r)).
      * "indices": every rank all-gathers the index tensors and solves the same deterministic plan with the
        Session's solver (`Session.solve_topk`); `remap="device"` (its default) then remaps the rank's rows
        into its k-buffer rows with torch ops on the indices' device, `"plan"` takes the plan's pool.
      * "auto" (default): "summaries" when the Session has a rank, else "indices".
    A rank whose rows are rejected, or whose Session or indices differ from the others' (S, P, heads,
    solver options, the indices' dtype and selection heads), makes every rank raise the same ValueError in
    the exchange (no rank is left in a collective). With "indices" the ranks' widths k may differ (each is
    padded to the widest)."""
    P = session.options["cp_size"]
    g, rank, size, devs = _group_info(group, P)
    err = None
    try:
        checking = _checking(check_peers, g, size)
    except ValueError as e:
        err, checking = str(e), g is not None and size > 1
    if gather == "auto":
        gather = "summaries" if session.options.get("rank") is not None else "indices"
    if err is None and gather not in ("summaries", "indices"):
        err = f"gather: expected 'auto', 'summaries' or 'indices', got {gather!r}"
    if remap is None:
        remap = "device"
    if err is None and remap not in ("device", "plan"):
        err = f"remap: expected 'device' or 'plan', got {remap!r}"
    if err is None and not isinstance(causal, bool):
        err = f"causal: expected True or False, got {causal!r}"
    if err is not None:
        pass
    elif size != P:
        err = f"group: the process group has {size} ranks, the Session was made for P = {P} (cp_size)"
    elif not isinstance(indices, torch.Tensor):
        err = f"indices: expected a torch.Tensor [rows, H_kv, k], got {type(indices).__name__}"
    elif indices.dim() != 3:
        err = f"indices: expected shape [rows, H_kv, k], got shape {tuple(indices.shape)}"
    elif indices.dtype not in (torch.int32, torch.int64):
        err = f"indices: expected int32 or int64 key positions, got {indices.dtype}"
    else:
        S = session.options["seqlen"]
        if S <= 0:
            err = "session: solving index masks across ranks needs the Session's seqlen (S) to be set"
        else:
            import cpsched
            lo, hi = (int(x) for x in cpsched._cpsched.sharding_ranges(S, P)[rank])
            if indices.shape[0] != hi - lo:
                err = (f"indices: this rank (rank {rank}) hosts {hi - lo} of S = {S} tokens in the sequential "
                       f"layout, the indices have {indices.shape[0]} rows")
            elif gather == "summaries" and session.options.get("rank") != rank:
                err = (f"session: the Session plans for rank {session.options.get('rank')}, this process is rank "
                       f"{rank} of the group (Session(..., rank=group rank) for per-rank summaries)")
    dev = indices.device if isinstance(indices, torch.Tensor) else "cpu"
    if gather == "summaries":
        claim = _ingest_claim(session, indices, causal, gather, remap, False) if err is None else Claim("ingest_topk")
        return _ingest_summaries(indices, session, g, rank, size, causal, err, remap == "device", claim)
    claim = _ingest_claim(session, indices, causal, gather, remap, False) if err is None else Claim("ingest_topk")
    if checking:
        exchange(claim, err, g, rank, size, dev)
    elif err:
        raise ValueError(err)
    if g is not None and size > 1:
        # the widths and dtypes may differ (an uneven selection, int32 beside int64): every rank pads to the
        # widest, in int64 if any rank has int64 keys
        kk = torch.tensor([int(indices.shape[2]), int(indices.dtype == torch.int64)], dtype=torch.int64, device=dev)
        ks = [torch.empty_like(kk) for _ in range(size)]
        _groups.all_gather(ks, kk, g)
        kmax = max(int(x[0]) for x in ks)
        dt = torch.int64 if any(int(x[1]) for x in ks) else torch.int32
        import cpsched
        rows = [int(e) - int(b) for b, e in cpsched._cpsched.sharding_ranges(session.options['seqlen'], P)]
        mx = max(rows)
        pad = torch.full((mx, indices.shape[1], kmax), -1, dtype=dt, device=indices.device)
        pad[:indices.shape[0], :, :indices.shape[2]] = indices
        parts = [torch.empty_like(pad) for _ in range(size)]
        _groups.all_gather(parts, pad, g)
        full = torch.cat([p[:n] for p, n in zip(parts, rows)])
    else:
        full = indices
    result = session.solve_topk(full.cpu().contiguous().numpy(), causal=causal)
    tp = prepare(result, rank)
    if not tp.layout.sequential:
        raise ValueError(f"session: the solver '{result.solver}' laid the tokens out anew ({tp.layout!r}); index "
                         f"masks given per rank need the sequential layout (a solver that keeps it, or the "
                         f"'area' cost model)")
    if remap == "device":  # the executor reads the pools remapped here instead of the plan's own
        dp = tp.on(indices.device)
        with torch.inference_mode(False):  # kept on the plan: ordinary tensors
            dp.fwd.indices, dp.bwd.indices = remap_topk(tp, full, indices.device)
    return tp


def _ingest_summaries(indices, session, g, rank, size, causal, err, on_device, claim):
    """ingest_topk's per-rank path: summarise, exchange the summaries (or each rank's error: one collective,
    so a rejected rank stops every rank) with what every rank must share (`claim`), plan this rank's part
    (on_device: from its row runs counted where the indices are, then write the plan's index rows there)."""
    rows = runs = xs = None
    summary = None
    if err is None:
        try:
            if on_device:
                runs, xs = summarize_topk(indices.detach(), session, causal)
                summary = runs.summary
            else:
                rows = indices.detach().cpu().contiguous().numpy()
                summary = session.summarize_topk(rows, causal=causal)
        except ValueError as e:
            err = str(e)
    mine = ("error", err, None) if err else ("summary", summary, claim.vector(size, None))
    if g is not None and size > 1:
        got = [None] * size
        _groups.all_gather_object(got, mine, g)
    else:
        got = [mine]
    if err:
        raise ValueError(err)
    bad = [r for r, (kind, _, _) in enumerate(got) if kind == "error"]
    if bad:
        raise ValueError(f"rank(s) {bad} of the group rejected their top-k rows ({got[bad[0]][1]}); rank {rank} "
                         f"stopped before any collective of the plan")
    compare([x[2] for x in got], claim, size)
    sums = [x for _, x, _ in got]
    if not on_device:
        tp = prepare(session.solve_topk_summaries(sums, rows, causal=causal), rank)
        return tp.declare_no_forwarding()
    tp = prepare(session.solve_topk_runs(sums, runs), rank)
    tp.declare_no_forwarding()  # per-rank ingestion builds its plans without relays (docs/torch.md)
    dp = tp.on(indices.device)
    with torch.inference_mode(False):
        dp.fwd.indices, dp.bwd.indices = write_index_rows(tp, xs)
    return tp


# (session, group, rank, mask) -> TorchPlan: layers that share a mask share its plan. The session and the group
# are held weakly (a cache that kept a process group alive kept gloo's threads running into the interpreter's exit).
_SHARED = OrderedDict()


def _weak(x):
    return (lambda: None) if x is None else weakref.ref(x)
_SHARED_SIZE = 32
_SHARED_LOCK = threading.Lock()


class DistAttention(torch.nn.Module):
    """Attention of this rank's shards under a mask given per call, planned by `session` for the ranks of
    `group`: `attn(q, k, v, mask)` with mask = (q_ranges, k_ranges, types) (or a cpsched.Mask) of global token
    ranges, or a token top-k index tensor [rows, H_kv, k] (this rank's rows). Range masks are solved once per
    distinct mask (a cache of `cache_size` plans in front of the Session's own); index masks every call.
    Keyword arguments of `cpsched.torch.attention` (backend, layout, return_lse, ...) pass through."""

    def __init__(self, session, group=None, backend="auto", cache_size=16, causal=True):
        super().__init__()
        self.session = session
        self.group = group
        self.backend = backend
        self.causal = causal
        self.cache_size = int(cache_size)
        self._plans = OrderedDict()
        P = session.options["cp_size"]
        if _groups.own(group) or (dist.is_available() and dist.is_initialized()):
            _, rank, n, _ = _groups.info(group, P)
            if n != P:
                raise ValueError(f"group: the process group has {n} ranks, the Session plans for P = {P} (cp_size)")
            self.rank = rank
        else:
            if P != 1:
                raise ValueError(f"group: the Session plans for P = {P} ranks but torch.distributed is not "
                                 f"initialized")
            self.rank = 0
        self.hits = 0
        self.misses = 0
        self.last_plan = None

    def plan(self, mask):
        """The TorchPlan of a range mask for this rank (solved on a miss; for a data loader that dispatches)."""
        if isinstance(mask, Mask):
            q, k, t = mask.q_ranges, mask.k_ranges, mask.types
        else:
            try:
                q, k, t = mask
            except (TypeError, ValueError):
                raise ValueError("mask: expected (q_ranges, k_ranges, types), a cpsched.Mask, or an index tensor "
                                 "[rows, H_kv, k]") from None
        qr = _ranges(q.cpu() if isinstance(q, torch.Tensor) else q, "q_ranges")
        kr = _ranges(k.cpu() if isinstance(k, torch.Tensor) else k, "k_ranges")
        tt = _types(t.cpu() if isinstance(t, torch.Tensor) else t, len(qr))
        key = (qr.tobytes(), kr.tobytes(), tt.tobytes())
        tp = self._plans.get(key)
        if tp is not None:
            self._plans.move_to_end(key)
            self.hits += 1
            return tp
        self.misses += 1
        skey = (id(self.session), id(self.group), self.rank) + key
        with _SHARED_LOCK:  # the ranks of a loopback group are threads of one process
            hit = _SHARED.get(skey)
            if hit is not None and hit[0]() is self.session and hit[1]() is self.group:
                _SHARED.move_to_end(skey)
        if hit is not None and hit[0]() is self.session and hit[1]() is self.group:
            tp = hit[2]
        else:
            tp = TorchPlan(self.session.solve(qr, kr, tt), self.rank)
            if not self.session.options.get("relay_node_size"):
                tp.declare_no_forwarding()  # a rank's own plan of a Session without relays
            with _SHARED_LOCK:
                _SHARED[skey] = (_weak(self.session), _weak(self.group), tp)
                while len(_SHARED) > _SHARED_SIZE:
                    _SHARED.popitem(last=False)
        self._plans[key] = tp
        while len(self._plans) > self.cache_size:
            self._plans.popitem(last=False)
        return tp

    _ATTENTION_KW = ("backend", "return_lse", "layout", "softmax_scale", "check_peers", "graphs")

    def forward(self, q, k, v, mask, **kw):
        bad = sorted(set(kw) - set(self._ATTENTION_KW))
        if bad:
            raise TypeError(f"DistAttention.forward() got unexpected keyword argument(s) {bad}")
        kw.setdefault("backend", self.backend)
        # The mask is solved on this rank alone: an error here (a mask that is not valid, a Session that
        # plans for another rank) goes into the attention's agreement, so that every rank raises it.
        err, tp = None, None
        try:
            if isinstance(mask, torch.Tensor) and mask.dim() == 3:
                tp = ingest_topk(mask, self.session, self.group, causal=self.causal,
                                 check_peers=kw.get("check_peers"))
            else:
                tp = self.plan(mask)
        except (ValueError, RuntimeError, TypeError) as e:
            err = str(e) if isinstance(e, ValueError) else f"mask: {type(e).__name__}: {e}"
        self.last_plan = tp  # the TorchPlan this call ran
        return _attention(q, k, v, tp, self.group, kw["backend"], kw.get("return_lse", False), kw.get("layout"),
                          kw.get("softmax_scale"), kw.get("check_peers"), err, graphs=kw.get("graphs", False))
