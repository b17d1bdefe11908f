"""ContextParallel: cpsched attention for a whole model, one packed batch per step.

The data loader gives each step's packed batch once (`shard`: the whole sequence's position ids or
cu_seqlens, and the tensors to cut); every attention layer then asks for its mask by kind (`attention(q, k,
v, window=..., causal=...)`): the step's mask of that kind is built once, solved once per distinct mask and
kept for the step, so layers with equal masks, the backward and an activation checkpoint's recompute run the
same plan without solving again. Nothing here issues a collective except the attention calls themselves (and
`gather_batch`, which a loader that shards on its own calls once per step on every rank).
"""
from __future__ import annotations

import weakref
from collections import OrderedDict

import torch
import torch.distributed as dist

from .. import _api
from .._plan import TorchPlan
from .ops import cp_attention, kind_id, register_context
from .documents import bounds_from_cu_seqlens, bounds_from_position_ids, document_mask, mask_digest, position_ids_of


def resolve_group(group=None, mesh=None, mesh_dim="cp"):
    """The process group of the CP ranks: `group` (a ProcessGroup, a 1-D DeviceMesh, or None: the world), or
    dimension `mesh_dim` of a DeviceMesh `mesh`."""
    if mesh is not None:
        if group is not None:
            raise ValueError("group: give a group or a mesh, not both")
        names = getattr(mesh, "mesh_dim_names", None) or ()
        if mesh.ndim > 1 and mesh_dim not in names:
            raise ValueError(f"mesh_dim: {mesh_dim!r} is not a dimension of the mesh (its dimensions: {list(names)})")
        return mesh.get_group(mesh_dim) if mesh.ndim > 1 or mesh_dim in names else mesh.get_group()
    if group is not None and hasattr(group, "get_group") and hasattr(group, "ndim"):  # a DeviceMesh
        if group.ndim != 1:
            raise ValueError(f"group: a DeviceMesh of {group.ndim} dimensions; pass mesh=..., mesh_dim='cp' to "
                             f"pick its CP dimension")
        return group.get_group()
    return group


class Step:
    """One packed batch: its documents (`bounds`: [0, ..., S]), this rank's rows [lo, hi) of the sequential
    layout, its positions there, and the plans its layers ran (per mask)."""

    __slots__ = ("serial", "bounds", "seqlen", "lo", "hi", "local_positions", "masks", "plans", "_checked",
                 "__weakref__")

    def __init__(self, serial, bounds, rank, size):
        import cpsched
        self.serial = serial
        self.bounds = bounds
        self.seqlen = int(bounds[-1])
        lo, hi = (int(x) for x in cpsched._cpsched.sharding_ranges(self.seqlen, size)[rank])
        self.lo, self.hi = lo, hi
        self.local_positions = position_ids_of(bounds)[lo:hi]
        self.masks = {}   # (window, causal) -> (q_ranges, k_ranges, types, digest)
        self.plans = {}   # (mask digest, heads) -> TorchPlan
        self._checked = {}  # id(position ids tensor) -> weakref: tensors already compared with local_positions

    @property
    def documents(self):
        return len(self.bounds) - 1

    def mask(self, window, causal):
        key = (window, bool(causal))
        m = self.masks.get(key)
        if m is None:
            q, k, t = document_mask(self.bounds, window, causal)
            m = (q, k, t, mask_digest(q, k, t))
            self.masks[key] = m
        return m

    def check_positions(self, position_ids):
        """The text of what is wrong when the model runs on position ids other than this rank's rows of the
        step (a batch not given to `shard`, or the whole sequence's ids), else None. Each tensor is compared
        once (a device tensor is copied to the host for it)."""
        if position_ids is None:
            return None
        hit = self._checked.get(id(position_ids))
        if hit is not None and hit() is position_ids:
            return None
        p = position_ids
        if not isinstance(p, torch.Tensor):
            return f"position_ids: expected a tensor, got {type(p).__name__}"
        if p.dim() == 2 and p.shape[0] == 1:
            p = p[0]
        n = self.hi - self.lo
        if p.dim() != 1 or p.shape[0] != n:
            return (f"position_ids: the model got shape {tuple(position_ids.shape)}, this rank's shard of the step's "
                    f"S = {self.seqlen} tokens has {n} (rows [{self.lo}, {self.hi})): pass the local tensors that "
                    f"ContextParallel.shard returned")
        if not torch.equal(p.detach().to("cpu", torch.int64), self.local_positions):
            return (f"position_ids: the model got positions that are not this rank's rows [{self.lo}, {self.hi}) of "
                    f"the batch given to ContextParallel.shard (step {self.serial}); call shard (or set_batch) with "
                    f"each step's batch before the model runs on it")
        try:
            self._checked[id(position_ids)] = weakref.ref(position_ids)
        except TypeError:
            pass
        return None


class ContextParallel:
    """Context-parallel attention for the layers of one model on the ranks of `group` (a ProcessGroup, a 1-D
    DeviceMesh, None for the world or a single process; or `mesh=` a DeviceMesh and `mesh_dim` its CP
    dimension). `backend` and `check_peers` as for cpsched.torch.attention; the other keyword arguments are
    cpsched.Session's (solver, stages, cost_model, relay_node_size, ...), one Session per sequence length
    and head geometry. Per step: `shard(position_ids=..., **tensors)` (or `set_batch`), then the model."""

    def __init__(self, group=None, *, mesh=None, mesh_dim="cp", backend="auto", check_peers=None, plan_cache=16,
                 **session_options):
        self.group = resolve_group(group, mesh, mesh_dim)
        if dist.is_available() and dist.is_initialized():
            g = self.group if self.group is not None else dist.group.WORLD
            self.rank, self.size = dist.get_rank(g), dist.get_world_size(g)
        else:
            if self.group is not None:
                raise ValueError("group: torch.distributed is not initialized but a group was given")
            self.rank, self.size = 0, 1
        for k in ("cp_size", "seqlen", "heads"):
            if k in session_options:
                raise ValueError(f"{k}: ContextParallel sets the Session's {k} itself (the group's size, each "
                                 f"step's S, the layers' q / k / v)")
        self.session_options = dict(session_options)
        if "rank" in self.session_options and self.session_options["rank"] not in (None, self.rank):
            raise ValueError(f"rank: the Session would plan for rank {self.session_options['rank']}, this process "
                             f"is rank {self.rank} of the group")
        self.backend = backend
        self.check_peers = check_peers
        self.plan_cache = int(plan_cache)
        self.step = None
        self._serial = 0
        self._serial_id = register_context(self)  # what the compiled custom operator names this context by
        self._sessions = OrderedDict()
        self._plans = OrderedDict()  # across steps: a repeated mask (the same pack again) is not solved again
        self.stats = {"steps": 0, "calls": 0, "solves": 0, "step_hits": 0, "cache_hits": 0}

    # ---- the step's batch -------------------------------------------------------------------------

    def set_batch(self, position_ids=None, *, cu_seqlens=None):
        """Makes the whole packed sequence's documents this step's (no collective): `position_ids` [S] or
        [1, S], or `cu_seqlens` [0, ..., S]. Returns the Step."""
        if (position_ids is None) == (cu_seqlens is None):
            raise ValueError("set_batch: give position_ids (the whole sequence's, [S] or [1, S]) or cu_seqlens, "
                             "exactly one of them")
        bounds = bounds_from_position_ids(position_ids) if cu_seqlens is None else bounds_from_cu_seqlens(cu_seqlens)
        self._serial += 1
        self.step = Step(self._serial, bounds, self.rank, self.size)
        self.stats["steps"] += 1
        return self.step

    def shard(self, position_ids=None, *, cu_seqlens=None, **tensors):
        """This step's batch: sets its documents (set_batch) and returns this rank's rows of `position_ids`
        and of every other tensor given by name (input_ids, labels, ...: [S] or [B = 1, S, ...], the sequence
        along dim 0 of a vector, dim 1 otherwise). `position_ids` is always among the results (from
        cu_seqlens when not given, as [1, S / P])."""
        step = self.set_batch(position_ids, cu_seqlens=cu_seqlens)
        out = {}
        items = list(tensors.items())
        if position_ids is not None:
            items.insert(0, ("position_ids", position_ids))
        else:
            out["position_ids"] = step.local_positions.clone().unsqueeze(0)
        for name, t in items:
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{name}: expected a tensor, got {type(t).__name__}")
            d = 0 if t.dim() == 1 else 1
            if t.dim() == 0 or (d == 1 and t.shape[0] != 1) or t.shape[d] != step.seqlen:
                raise ValueError(f"{name}: expected shape [S] or [1, S, ...] with the batch's S = {step.seqlen}, got "
                                 f"{tuple(t.shape)}")
            out[name] = t.narrow(d, step.lo, step.hi - step.lo)
        return out

    def gather_batch(self, position_ids):
        """For a loader that shards on its own: this rank's position ids ([L] or [1, L], its rows of the
        sequential layout) all-gathered over the group into the whole sequence's, then set_batch. A
        collective: every rank calls it once per step."""
        p = position_ids
        if not isinstance(p, torch.Tensor):
            raise ValueError(f"position_ids: expected a tensor, got {type(p).__name__}")
        p = p.reshape(-1).to(torch.int64)
        if self.size == 1:
            return self.set_batch(p)
        g = self.group if self.group is not None else dist.group.WORLD
        n = torch.tensor([p.shape[0]], dtype=torch.int64, device=p.device)
        ns = [torch.empty_like(n) for _ in range(self.size)]
        dist.all_gather(ns, n, group=g)
        lens = [int(x) for x in ns]
        mx = max(lens)
        pad = torch.zeros(mx, dtype=torch.int64, device=p.device)
        pad[:p.shape[0]] = p
        parts = [torch.empty_like(pad) for _ in range(self.size)]
        dist.all_gather(parts, pad, group=g)
        whole = torch.cat([x[:m] for x, m in zip(parts, lens)])
        import cpsched
        seq = cpsched._cpsched.sharding_ranges(int(whole.shape[0]), self.size)
        bad = [r for r in range(self.size) if int(seq[r][1] - seq[r][0]) != lens[r]]
        if bad:
            raise ValueError(f"position_ids: the ranks hold {lens} tokens; the sequential layout of S = "
                             f"{whole.shape[0]} over P = {self.size} gives rank(s) {bad} another count")
        return self.set_batch(whole)

    # ---- plans --------------------------------------------------------------------------------------

    def _session(self, S, heads):
        import cpsched
        key = (S,) + heads
        s = self._sessions.get(key)
        if s is None:
            hq, hkv, dqk, dv, itemsize = heads
            s = cpsched.Session(cp_size=self.size, seqlen=S,
                                heads={"q": hq, "kv": hkv, "dim": dqk, "dim_v": dv, "dtype": itemsize},
                                **self.session_options)
            self._sessions[key] = s
            while len(self._sessions) > 4:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(key)
        return s

    def plan(self, window=None, causal=True, heads=None):
        """The TorchPlan of this step's mask of a kind (`window`, `causal`) for `heads` = (hq, hkv, d_qk, d_v,
        element bytes): solved once per distinct mask, then served from the step (and from a small cache across
        steps, for a batch seen again)."""
        step = self.step
        if step is None:
            raise ValueError("batch: no batch for this step; call ContextParallel.shard (or set_batch) with the "
                             "step's packed batch before the model runs")
        q, k, t, dig = step.mask(window, causal)
        key = (dig,) + tuple(heads)
        tp = step.plans.get(key)
        if tp is not None:
            self.stats["step_hits"] += 1
            return tp
        key2 = (step.seqlen,) + key
        tp = self._plans.get(key2)
        if tp is not None:
            self._plans.move_to_end(key2)
            self.stats["cache_hits"] += 1
        else:
            session = self._session(step.seqlen, tuple(heads))
            tp = TorchPlan(session.solve(q, k, t), self.rank)
            if not self.session_options.get("relay_node_size"):
                tp.declare_no_forwarding()  # a rank's own plan of a Session without relays
            self.stats["solves"] += 1
            self._plans[key2] = tp
            while len(self._plans) > self.plan_cache:
                self._plans.popitem(last=False)
        step.plans[key] = tp
        return tp

    # ---- the attention call ------------------------------------------------------------------------

    def _plan_call(self, q, k, v, window, causal, position_ids, error):
        """(what is wrong with the call or None, its TorchPlan or None)."""
        self.stats["calls"] += 1
        err, tp = error, None
        if err is None:
            try:
                err = self.step.check_positions(position_ids) if self.step is not None else None
                if err is None:
                    for name, x in (("q", q), ("k", k), ("v", v)):
                        if not isinstance(x, torch.Tensor) or x.dim() != 3:
                            raise ValueError(f"{name}: expected a tensor [tokens, heads, dim], got "
                                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
                    heads = (int(q.shape[1]), int(k.shape[1]), int(q.shape[2]), int(v.shape[2]), q.dtype.itemsize)
                    tp = self.plan(window, causal, heads)
            except (ValueError, RuntimeError) as e:
                err = str(e) if isinstance(e, ValueError) else f"plan: {type(e).__name__}: {e}"
        return err, (None if err is not None else tp)

    def attention(self, q, k, v, *, window=None, causal=True, softmax_scale=None, position_ids=None, error=None):
        """Attention of this rank's shards q [L, Hq, D], k [L, Hkv, D], v [L, Hkv, Dv] under this step's mask of
        a kind: causal in each document (default), a sliding window of `window` keys, or full (causal=False).
        `position_ids`: what the model computed its positions from, checked against the step's rows. `error`:
        what a caller found wrong before (it goes into the call's agreement, so every rank raises it). Under
        torch.compile the call is the custom operator torch.ops.cpsched.cp_attention (no graph break)."""
        if torch.compiler.is_compiling():
            out, _, _ = cp_attention(q, k, v, position_ids, kind_id(self, window, causal), softmax_scale,
                                     error or "")
            return out
        err, tp = self._plan_call(q, k, v, window, causal, position_ids, error)
        return _api._attention(q, k, v, tp, self.group, self.backend, False, None, softmax_scale, self.check_peers,
                               err)

    def _call(self, q, k, v, window, causal, softmax_scale, position_ids, error):
        """The custom operator's forward: (out, lse, what its backward needs: plan, backend, Comm, scale)."""
        from .._agree import scale_value
        from .._backends import make_backend
        from .._exec import Comm
        err, tp = self._plan_call(q, k, v, window, causal, position_ids, error)
        out, lse = _api._attention(q, k, v, tp, self.group, self.backend, True, None, softmax_scale,
                                   self.check_peers, err)
        g = _api._group_info(self.group, tp.cp_size)[0]
        scale = scale_value(softmax_scale, 1.0 / (tp.dqk ** 0.5))[1]
        return out, lse, (tp, make_backend(self.backend, q.device, q.dtype, tp), Comm(g), scale)

    def __repr__(self):
        s = self.step
        return (f"<cpsched.torch ContextParallel rank {self.rank} of {self.size}"
                + (f", step {s.serial}: S = {s.seqlen}, {s.documents} documents" if s is not None else "") + ">")
