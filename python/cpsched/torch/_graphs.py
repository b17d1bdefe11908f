"""CUDA graphs of a plan's passes: `cpsched.torch.attention(..., graphs=True)` (docs/torch.md, "Graphs").

A pass of a plan is a fixed program: the same ops on the same workspace buffers every call (_exec.py,
_workspace.py). With graphs=True the forward and the backward of each (plan, device, dtype, shapes, backend,
scale, group) are captured once and replayed: a call copies its inputs into the entry's static inputs (q, k, v;
backward also O, lse, dO), replays, and converts the accumulators to its outputs (the copies eager makes too).

Lifecycle of an entry: its first call runs eagerly (it lays the workspace out and fills every cache: row
indices, batches, masks); the second runs eagerly once more on the capture stream and then captures the
pass; later calls replay. A workspace that grew since (another plan needed more bytes) has moved the buffers
the graph points at: the entry starts again from its first state.

Where capture cannot work the call runs eagerly and says why, once per entry (a warning of one line):
gloo or a loopback group (their collectives are host work), a plan whose index rows are written per call
(ingest_topk), the flex backend (it builds masks and compiles on the host), a host sync inside the pass
(an op that reads a device value: `.item()`, `nonzero`, a copy between devices), and a workspace that grew
while capturing. The host syncs are found before the device sees them: while capturing, a dispatch mode
(`_Checker`) looks at every aten op the pass issues and stops the capture before such an op.

On the CPU the same logic runs with a recording stand-in (`RECORD_ON_CPU`, the tests): "capture" records
every aten op of the pass with its tensors, "replay" runs the recorded ops again on the same tensors (the
static inputs, the workspace, the tensors made during capture, into which each op's fresh result is copied)
-- what a CUDA graph does with addresses. The checker also records which tensors the program reads and
writes that it did not make itself: the tests show they are the workspace, the static inputs and the plan's
own constant tensors, never the call's inputs.
"""
from __future__ import annotations

import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from . import _groups
from ._exec import backward_program, forward_program, run_backward, run_forward
from ._workspace import arena

# The CPU stand-in of capture and replay (tests): off, CPU tensors run eagerly with graphs=True.
RECORD_ON_CPU = False

_aten = torch.ops.aten
# Ops that make the host wait for the device (or read device memory on the host): never inside a graph.
_SYNCS = {_aten._local_scalar_dense, _aten.nonzero, _aten.equal, _aten.is_nonzero, _aten.item,
          _aten.masked_select, _aten.unique_dim, _aten._unique2, _aten.unique_consecutive, _aten.allclose}
_SYNCS = {x for x in _SYNCS if x is not None}


class NotCapturable(Exception):
    """A pass that cannot be captured; the message is the one-line reason."""


def _storage(t):
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


class _Checker(TorchDispatchMode):
    """Looks at every aten op a pass issues while it is captured: stops the capture (NotCapturable) before an
    op that syncs the host or copies between devices; with `record`, keeps each op with its tensors for the
    CPU stand-in's replay, and which storages the program reads and writes that it did not make itself."""

    def __init__(self, record):
        super().__init__()
        self.record = record
        self.ops = []
        self.made = set()   # storages of tensors made during capture
        self.reads = set()  # storages read that the program did not make
        self.writes = set()  # ... and written

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in _SYNCS or func in _SYNCS:
            raise NotCapturable(f"a host sync inside the pass ({func}: the host reads a device value)")
        flat, _ = tree_flatten((args, kwargs))
        tens = [t for t in flat if isinstance(t, torch.Tensor)]
        devs = {t.device.type for t in tens} - {"meta"}
        if len(devs) > 1:
            raise NotCapturable(f"a copy between devices inside the pass ({func} on {sorted(devs)})")
        out = func(*args, **kwargs)
        written = self._written(func, args, kwargs)
        ins = {_storage(t) for t in tens}
        for t in tens:
            p = _storage(t)
            if p is not None and p not in self.made:
                (self.writes if id(t) in written else self.reads).add(p)
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        fresh = []
        for t in outs:
            p = _storage(t)
            if p is not None and p not in ins:
                self.made.add(p)
                fresh.append(t)
        if self.record:
            self.ops.append((func, args, kwargs, out, fresh))
        return out

    @staticmethod
    def _written(func, args, kwargs):
        """ids of the tensor arguments the op writes (its schema's mutable aliases: in place, out=)."""
        ids = set()
        schema = func._schema
        for i, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                v = args[i] if i < len(args) else kwargs.get(a.name)
                for t in tree_flatten(v)[0]:
                    if isinstance(t, torch.Tensor):
                        ids.add(id(t))
        return ids

    def replay(self):
        """The CPU stand-in of a graph launch: every recorded op again on the recorded tensors; a fresh result
        is copied into the tensor the capture made (its "address")."""
        for func, args, kwargs, out, fresh in self.ops:
            res = func(*args, **kwargs)
            if fresh:
                new = [t for t in tree_flatten(res)[0] if isinstance(t, torch.Tensor)]
                old = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
                for a, b in zip(old, new):
                    if any(a is f for f in fresh):
                        a.copy_(b)


class _Entry:
    __slots__ = ("state", "reason", "static", "outs", "graph", "checker", "arena_buf", "grown", "warned")

    def __init__(self):
        self.state = "new"  # new -> warm -> graph, or eager (with a reason)
        self.reason = None
        self.static = None
        self.outs = None
        self.graph = None
        self.checker = None
        self.arena_buf = None
        self.grown = -1
        self.warned = False


def backend_key(backend):
    k = getattr(backend, "graph_key", None)
    return k() if callable(k) else ("object", id(backend))


def _comm_reason(comm, device):
    """Why the collectives of `comm` cannot be captured on `device` (or None)."""
    if getattr(comm, "capturable", None) is True:
        return None
    g = getattr(comm, "group", None)
    if g is None:
        return None  # one rank without a process group: no collective
    if _groups.own(g):
        return "the loopback group's collectives are host rendezvous"
    from ._agree import group_device_types
    b = group_device_types(g).get(device.type)
    if b == "gloo" or (device.type == "cpu" and b is not None):
        return f"the group's collectives on {device.type} tensors run on {b} (host work)"
    return None


def _prior_reason(dp, backend, comm, device):
    if device.type != "cuda" and not (device.type == "cpu" and RECORD_ON_CPU):
        return f"CUDA graphs need CUDA tensors (q is on {device})"
    if dp.tp.deferred:
        return "the plan's index rows are written per call (ingest_topk)"
    if getattr(backend, "name", None) == "flex":
        return "the flex backend builds its block masks and compiles on the host"
    return _comm_reason(comm, device)


def _entry(dp, key):
    reg = getattr(dp, "graphs", None)
    if reg is None:
        reg = dp.graphs = {}
    e = reg.get(key)
    if e is None:
        e = reg[key] = _Entry()
    return e


def _fallback(e, reason):
    e.state, e.reason = "eager", reason
    e.graph = e.checker = e.static = e.outs = None
    if not e.warned:
        e.warned = True
        warnings.warn(f"cpsched.torch graphs=True: running eagerly: {reason}", RuntimeWarning, stacklevel=4)


def _fresh_arena(e, ar):
    return ar.buf is e.arena_buf and ar.grown == e.grown


def _run(e, device, program, inputs, convert):
    """One call through entry `e`: eager (new / eager), eager + capture (warm), or a replay (graph)."""
    ar = arena(device)
    if e.state == "graph" and not _fresh_arena(e, ar):
        e.state, e.graph, e.checker, e.outs = "new", None, None, None  # the workspace moved: lay out again
    if e.state == "graph":
        for s, x in zip(e.static, inputs):
            if s is not None:
                s.copy_(x)
        if e.graph is not None:
            e.graph.replay()
        else:
            e.checker.replay()
        return convert(e.outs)
    if e.state in ("new", "eager"):
        if e.state == "new":
            e.state = "warm"
        return convert(program(*inputs))
    # warm: capture now
    e.static = [None if x is None else torch.empty_like(x, memory_format=torch.contiguous_format) for x in inputs]
    for s, x in zip(e.static, inputs):
        if s is not None:
            s.copy_(x)
    grown = ar.grown
    try:
        if device.type == "cuda":
            result = _capture_cuda(e, device, program, e.static, convert)
        else:
            chk = _Checker(record=True)
            with chk:
                outs = program(*e.static)
            e.checker, e.outs, e.graph = chk, outs, None
            result = convert(outs)
    except NotCapturable as exc:
        _fallback(e, str(exc))
        return convert(program(*inputs))
    if ar.grown != grown:
        _fallback(e, "the workspace grew while the pass was captured")
        return result
    e.state, e.arena_buf, e.grown = "graph", ar.buf, ar.grown
    return result


def _capture_cuda(e, device, program, args, convert):
    """Runs the pass eagerly on a side stream (its result is this call's), then captures it there."""
    cur = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        result = convert(program(*args))
    cur.wait_stream(side)
    for t in result:
        if t is not None:
            t.record_stream(cur)
    g = torch.cuda.CUDAGraph()
    chk = _Checker(record=False)
    try:
        with chk:
            with torch.cuda.graph(g, pool=_pool(device), stream=side):
                e.outs = program(*args)
    except NotCapturable:
        raise
    except Exception as exc:  # noqa: BLE001 - a capture the checker did not foresee: eager, with its reason
        raise NotCapturable(f"capture failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from exc
    e.graph, e.checker = g, None
    return result


_POOLS = {}


def _pool(device):
    """One memory pool per device for every captured pass: the passes replay one at a time on one stream and
    their outputs are converted right after, so they can share it."""
    key = str(device)
    p = _POOLS.get(key)
    if p is None:
        p = _POOLS[key] = torch.cuda.graph_pool_handle()
    return p


def _call_entry(pass_, dp, q, k, v, backend, comm, scale):
    """The graph entry of one pass of a call (per dtype, shapes, backend, scale and group); a new one that cannot
    be captured falls back at once, with its reason."""
    key = (pass_, q.dtype, tuple(q.shape), tuple(k.shape), None if v is None else tuple(v.shape),
           backend_key(backend), float(scale), id(getattr(comm, "group", None)))
    e = _entry(dp, key)
    if e.state == "new" and e.reason is None:
        why = _prior_reason(dp, backend, comm, q.device)
        if why is not None:
            _fallback(e, why)
    return e


def forward(dp, q, k, v, backend, comm, scale):
    """Forward of one call with graphs: O (q's dtype), lse fp32."""
    device = q.device
    e = _call_entry("fwd", dp, q, k, v, backend, comm, scale)
    if e.state == "eager":
        return run_forward(dp, q, k, v, backend, comm, scale)
    dt = q.dtype

    def program(qq, kk, vv):
        return forward_program(dp, qq, kk, vv, backend, comm, scale)

    def convert(outs):
        o, lse = outs
        return o.to(dt, copy=True), lse.to(torch.float32, copy=True)
    return _run(e, device, program, [q, k, v], convert)


def backward(dp, q, k, v, out, lse, dout, backend, comm, scale):
    """Backward of one call with graphs: dQ, dK, dV (None for a shared latent)."""
    device = q.device
    dt = q.dtype
    out, dout, lse = out.to(dt), dout.to(dt), lse.float()
    e = _call_entry("bwd", dp, q, k, v, backend, comm, scale)
    if e.state == "eager":
        return run_backward(dp, q, k, v, out, lse, dout, backend, comm, scale)

    def program(qq, kk, vv, oo, ll, dd):
        return backward_program(dp, qq, kk, vv, oo, ll, dd, backend, comm, scale)

    def convert(outs):
        dq, dk, dv = outs
        return dq.to(dt, copy=True), dk.to(dt, copy=True), (None if dv is None else dv.to(dt, copy=True))
    return _run(e, device, program, [q, k, v, out, lse, dout], convert)


def state(dp):
    """{(pass, ...key): (state, reason)} of a device plan's entries (tests, benchmarks)."""
    return {k: (e.state, e.reason) for k, e in (getattr(dp, "graphs", None) or {}).items()}
