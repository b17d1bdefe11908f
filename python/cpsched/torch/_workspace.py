"""The executor's memory: one workspace per device, shared by every plan (docs/torch.md, "Memory").

A plan's pass is a program (`_exec._Workspace`): which buffers it needs, at which offsets, and the views its
collectives and kernels read and write. The bytes live in the device's `Arena`, one uint8 tensor that every
program lays itself out in from offset 0: the calls of a process run one at a time (each pass waits for its
collectives before it returns, and copies its outputs out), so the programs of all plans, layers and passes
can share it. The arena grows to the largest program it has served (rounded up to 1 MiB) and never holds a
call's tensors once its pass is over, so what cpsched keeps between calls is one arena per device plus each
cached plan's index tensors, whatever the number of plans.

A program's views of the arena are kept in the arena (`bound`, weakly keyed by the plan's device pass), not in
the plan: when the arena grows, every binding goes with the old buffer, and a plan that is dropped drops its
binding. Everything here is made with inference mode off, so a first call under torch.inference_mode() leaves
ordinary tensors that later training calls can write. Backends take scratch space from the same arena
(`Carver.take` through the program), after the program's own buffers: its offsets are fixed per program, so a
captured program (a CUDA graph, docs/torch.md) would see the same addresses every call.
"""
from __future__ import annotations

import collections
import math
import threading
import weakref

import torch

ALIGN = 256          # bytes: every buffer starts at a multiple (any dtype's view, and vectorised kernels)
_GRANULE = 1 << 20   # the arena grows in whole MiB


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


MAX_BOUND = 16  # programs kept laid out per arena (the most recently used): their row indices are per plan


class Arena:
    """One device's workspace bytes and the programs bound to them (at most MAX_BOUND, least recently used
    out; a plan whose program was dropped lays it out again on its next call)."""

    __slots__ = ("device", "buf", "bound", "order", "busy", "grown", "__weakref__")

    def __init__(self, device):
        self.device = torch.device(device)
        self.buf = None
        self.bound = weakref.WeakKeyDictionary()  # device pass -> {key: program bound to buf}
        self.order = collections.OrderedDict()  # (id(device pass), key) -> weakref(device pass)
        self.busy = False
        self.grown = 0  # how many times the buffer was replaced (tests, benchmarks)

    @property
    def nbytes(self):
        return 0 if self.buf is None else int(self.buf.numel())

    def get(self, owner, key):
        per = self.bound.get(owner)
        ws = per.get(key) if per is not None else None
        if ws is not None:
            self.order.move_to_end((id(owner), key))
        return ws

    def put(self, owner, key, ws):
        self.bound.setdefault(owner, {})[key] = ws
        self.order[(id(owner), key)] = weakref.ref(owner)
        while len(self.order) > MAX_BOUND:
            (_, k), ref = self.order.popitem(last=False)
            o = ref()
            per = self.bound.get(o) if o is not None else None
            if per is not None:
                per.pop(k, None)

    def grow(self, need):
        """Replaces the buffer by one of at least `need` bytes; every binding goes with the old one."""
        n = max(_GRANULE, math.ceil(need / _GRANULE) * _GRANULE)
        self.release()
        with torch.inference_mode(False):
            self.buf = torch.empty(n, dtype=torch.uint8, device=self.device)
        self.grown += 1

    def release(self):
        self.bound = weakref.WeakKeyDictionary()
        self.order.clear()
        self.buf = None


_ARENAS: "dict[tuple, Arena]" = {}
_ARENAS_LOCK = threading.Lock()
_SCOPE = threading.local()


def set_scope(name):
    """This thread's arenas: None (the process's, shared by every call) or a name of its own. The ranks of a
    loopback group are threads of one process whose calls run at the same time: each has its arenas."""
    _SCOPE.name = name


def arena(device):
    """The device's shared arena (made on first use) of this thread's scope."""
    key = (str(device), getattr(_SCOPE, "name", None))
    a = _ARENAS.get(key)
    if a is None:
        with _ARENAS_LOCK:
            a = _ARENAS.get(key)
            if a is None:
                a = _ARENAS[key] = Arena(device)
    return a


def workspace_bytes(device=None):
    """Bytes the executor's workspaces hold now: on `device`, or on every device (every scope)."""
    with _ARENAS_LOCK:
        arenas = list(_ARENAS.items())
    return sum(a.nbytes for (dev, _), a in arenas if device is None or dev == str(device))


def release_workspaces(scope=None):
    """Frees every device's workspace (the next call lays its program out again): e.g. after an evaluation
    with much longer sequences than training's. `scope`: only those of that scope (a loopback rank's), which
    are forgotten."""
    with _ARENAS_LOCK:
        for key in list(_ARENAS):
            if scope is None or key[1] == scope:
                _ARENAS[key].release()
                if scope is not None:
                    del _ARENAS[key]


class Carver:
    """Hands out tensors from an arena's buffer at aligned offsets, in order. When the buffer is too small (or
    there is none) it goes on counting on the meta device, so that the caller learns the bytes the program
    needs (`at`) and lays it out again in a larger buffer."""

    __slots__ = ("buf", "at", "overflow", "device")

    def __init__(self, buf, device):
        self.buf, self.at, self.overflow, self.device = buf, 0, buf is None, device

    def empty(self, shape, dtype):
        shape = tuple(int(s) for s in shape)
        n = math.prod(shape) * dtype.itemsize
        off = _align(self.at)
        self.at = off + n
        if self.overflow or self.at > self.buf.numel():
            self.overflow = True
            return torch.empty(shape, dtype=dtype, device="meta")
        return self.buf[off:off + n].view(dtype).view(shape)


class Scratch:
    """A program's scratch space in the arena after its own buffers, for backends (the flash backend's
    gathered stage inputs): per key the same offsets every call. What does not fit is allocated for the call
    alone and counted, so that the next call grows the arena to hold it."""

    __slots__ = ("start", "at", "cache", "need", "device")

    def __init__(self, start, device):
        self.start = self.at = _align(start)
        self.device = device
        self.cache = {}
        self.need = 0  # bytes past `start` the backends asked for

    def take(self, arena_buf, key, specs, build=None):
        """Tensors [(shape, dtype), ...] for `key` (one caller's buffers), the same ones every call; with
        `build`, what build(tensors) returns (views of them, made once)."""
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        sizes = [math.prod(s) * dt.itemsize for s, dt in specs]
        at, offs = self.at, []
        for n in sizes:
            at = _align(at)
            offs.append(at)
            at += n
        self.need = max(self.need, at - self.start)
        with torch.inference_mode(False):
            if arena_buf is not None and at <= arena_buf.numel():
                out = [arena_buf[o:o + n].view(dt).view(s) for o, n, (s, dt) in zip(offs, sizes, specs)]
                out = build(out) if build is not None else out
                self.cache[key] = out
                self.at = at
                return out
            out = [torch.empty(s, dtype=dt, device=self.device) for s, dt in specs]  # this call only
            return build(out) if build is not None else out
