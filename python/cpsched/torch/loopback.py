"""A process group whose P ranks are threads of one process (docs/torch.md, "Loopback").

    import cpsched.torch as cpt
    from cpsched.torch import loopback

    def rank_fn(rank, group, plan, q, k, v):
        lo, hi = ...                                    # this rank's rows
        return cpt.attention(q[lo:hi], k[lo:hi], v[lo:hi], plan, group=group)

    outs = loopback.run(rank_fn, 8, result, q, k, v)    # one GPU (or the CPU) runs a P = 8 plan

`run(fn, world_size, *args)` calls `fn(rank, group, *args)` on `world_size` threads and returns their results in
rank order. `group` serves everything cpsched.torch asks of a process group (cpsched.torch._groups: rank and
size, all_to_all_single with split lists, all_gather, all_gather_object, broadcast_object_list; also broadcast,
all_reduce and barrier for the callers' own use), with every collective made of device copies between the
ranks' tensors: NCCL refuses two ranks on one device, so this is how one GPU runs a P-rank plan with every
kernel real. The ranks' calls use one workspace each (their own arenas).

A collective is a rendezvous of all ranks: each deposits its input, waits until every rank has, copies what
it receives from the others' inputs (on CUDA after waiting for the event each depositor recorded on its stream),
and waits until every rank has read its input before it returns (on CUDA its stream waits for the readers'
events), so the input may be overwritten at once. Collectives are therefore synchronous on the host:
`async_op=True` returns a work whose wait() has nothing left to do. The ranks must issue the same collectives
in the same order (as cpsched.torch's plans do on every rank).

Nothing hangs: an exception on one thread fails the run with that rank's error (the ranks waiting in a
collective stop at once, the others at their next collective); a rank that returns while others wait in a
collective, ranks that call different collectives or split lists that do not match make every rank stop with
a LoopbackError naming them; and `timeout` (seconds) bounds every wait.
"""
from __future__ import annotations

import pickle
import threading

import torch

from . import _workspace

__all__ = ["run", "LoopbackError", "Group"]


class LoopbackError(RuntimeError):
    """The ranks of a loopback run did not meet in their collectives (named in the message)."""


class _Aborted(BaseException):
    """Raised on a rank waiting in a collective when another rank failed: not the run's error."""


class _Done:
    """What `async_op=True` returns: the collective is complete when it returns (see the module's text)."""

    def wait(self, timeout=None):  # noqa: ARG002 - torch's Work.wait signature
        return True

    def is_completed(self):
        return True


_DONE = _Done()


class _World:
    """The rendezvous of one run's ranks: collective number n of every rank meets in slot n."""

    def __init__(self, size, timeout):
        self.size = size
        self.timeout = timeout
        self.cv = threading.Condition()
        self.count = [0] * size  # collectives each rank has entered
        self.slots = {}
        self.failure = None  # (rank or None, exception): the run's error
        self.finished = set()

    def fail(self, rank, exc):
        with self.cv:
            if self.failure is None:
                self.failure = (rank, exc)
            self.cv.notify_all()

    def _wait(self, rank, n, name, done):
        """Waits (the lock held) until done() or a failure; a timeout fails the run."""
        import time
        end = None if self.timeout is None else time.monotonic() + self.timeout
        while not done():
            if self.failure is not None:
                raise _Aborted()
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                slot = self.slots.get(n)
                missing = [] if slot is None else [r for r in range(self.size) if r not in slot["here"]]
                self.failure = (None, LoopbackError(
                    f"loopback: rank {rank} waited {self.timeout} s in collective #{n} ({name}); ranks {missing} "
                    f"did not arrive"))
                self.cv.notify_all()
                raise _Aborted()
            self.cv.wait(left)
        if self.failure is not None:
            raise _Aborted()

    def meet(self, rank, name, payload):
        """Deposits `payload` and returns every rank's once all have (the slot's number and payloads)."""
        with self.cv:
            if self.failure is not None:
                raise _Aborted()
            n = self.count[rank]
            self.count[rank] += 1
            slot = self.slots.get(n)
            if slot is None:
                slot = self.slots[n] = {"name": name, "first": rank, "payload": [None] * self.size, "in": 0,
                                        "out": 0, "here": set()}
            if slot["name"] != name:
                self.failure = (None, LoopbackError(
                    f"loopback: the ranks called different collectives as collective #{n}: rank {slot['first']} "
                    f"{slot['name']}, rank {rank} {name}"))
                self.cv.notify_all()
                raise _Aborted()
            if self.finished:
                self.failure = (None, LoopbackError(
                    f"loopback: rank {rank} entered collective #{n} ({name}) after rank(s) {sorted(self.finished)} "
                    f"returned from the function: the ranks issue different numbers of collectives"))
                self.cv.notify_all()
                raise _Aborted()
            slot["payload"][rank] = payload
            slot["here"].add(rank)
            slot["in"] += 1
            self.cv.notify_all()
            self._wait(rank, n, name, lambda: slot["in"] == self.size)
            return n, slot["payload"]

    def leave(self, rank, n, event):
        """Waits until every rank has read what it needs of slot n (its inputs may then change); returns the
        events the ranks recorded after their reads (CUDA: the owner's stream waits for them)."""
        with self.cv:
            slot = self.slots[n]
            slot.setdefault("after", [None] * self.size)[rank] = event
            slot["out"] += 1
            self.cv.notify_all()
            self._wait(rank, n, slot["name"], lambda: slot["out"] == self.size)
            slot["gone"] = slot.get("gone", 0) + 1
            if slot["gone"] == self.size:
                del self.slots[n]
            return slot["after"]

    def finish(self, rank):
        with self.cv:
            self.finished.add(rank)
            waiting = [(n, s) for n, s in self.slots.items() if s["in"] < self.size]
            if waiting and self.failure is None:
                n, s = waiting[0]
                inside = sorted(s["here"])
                self.failure = (None, LoopbackError(
                    f"loopback: rank {rank} returned from the function while rank(s) {inside} wait in collective "
                    f"#{n} ({s['name']}): the ranks issue different numbers of collectives"))
                self.cv.notify_all()


def _event(t):
    """An event recorded on the current stream of a CUDA tensor's device (None for other devices)."""
    if t is None or t.device.type != "cuda":
        return None
    ev = torch.cuda.Event()
    ev.record(torch.cuda.current_stream(t.device))
    return ev


def _wait_events(events, device):
    if device.type != "cuda":
        return
    s = torch.cuda.current_stream(device)
    for ev in events:
        if ev is not None:
            s.wait_event(ev)


class Group:
    """One rank's handle of a loopback group (made by `run`). Its methods are collectives of all the run's
    ranks; cpsched.torch calls them through cpsched.torch._groups wherever it would call torch.distributed."""

    cpsched_group = True
    device_types = {"cpu": "loopback", "cuda": "loopback"}

    def __init__(self, world, rank):
        self._world = world
        self._rank = rank

    def rank(self):
        return self._rank

    def size(self):
        return self._world.size

    def __repr__(self):
        return f"<cpsched.torch.loopback.Group rank {self._rank} of {self._world.size}>"

    # ---- the collectives -----------------------------------------------------------------------------

    def _exchange(self, name, payload, read, device=None):
        """meet, then read(payloads) (this rank's copies; returns an event recorded after them on CUDA), then
        leave; on CUDA this rank's stream then waits for every rank's reads, so its input may change at once."""
        w = self._world
        n, got = w.meet(self._rank, name, payload)
        ev = None
        try:
            ev = read(got)
        finally:
            after = w.leave(self._rank, n, ev)
        if device is not None:
            _wait_events(after, device)

    def all_to_all_single(self, out, inp, out_splits=None, in_splits=None, async_op=False):
        P, me = self.size(), self._rank
        in_splits = _splits(in_splits, inp.shape[0], P, "in_splits")
        out_splits = _splits(out_splits, out.shape[0], P, "out_splits")
        ev = _event(inp)

        def read(got):
            bad = [p for p in range(P) if got[p][1][me] != out_splits[p]]
            if bad:
                p = bad[0]
                raise LoopbackError(f"loopback all_to_all_single: rank {me} expects {out_splits[p]} rows from rank "
                                    f"{p}, which sends it {got[p][1][me]}")
            _wait_events([got[p][2] for p in range(P) if out_splits[p]], out.device)
            at = 0
            for p in range(P):
                n = out_splits[p]
                if n:
                    src, sp, _ = got[p]
                    off = sum(sp[:me])
                    out.narrow(0, at, n).copy_(src.narrow(0, off, n))
                at += n
            return _event(out)

        self._exchange("all_to_all_single", (inp, in_splits, ev), read, inp.device)
        return _DONE if async_op else None

    def all_gather(self, parts, t, async_op=False):
        if len(parts) != self.size():
            raise ValueError(f"all_gather: {len(parts)} output tensors for a group of {self.size()}")

        def read(got):
            _wait_events([g[1] for g in got], parts[0].device if parts else t.device)
            for p, (src, _) in enumerate(got):
                if src.shape != parts[p].shape:
                    raise LoopbackError(f"loopback all_gather: rank {p} sends shape {tuple(src.shape)}, rank "
                                        f"{self._rank} expects {tuple(parts[p].shape)}")
                parts[p].copy_(src)
            return _event(parts[0]) if parts else None

        self._exchange("all_gather", (t, _event(t)), read, t.device)
        return _DONE if async_op else None

    def all_gather_object(self, objs, obj):
        data = pickle.dumps(obj)  # each rank gets its own copy, as between processes

        def read(got):
            for p, d in enumerate(got):
                objs[p] = pickle.loads(d)
        self._exchange("all_gather_object", data, read)

    def broadcast_object_list(self, objs, src=0):
        data = pickle.dumps(list(objs)) if self._rank == src else b""

        def read(got):
            vals = pickle.loads(got[src])
            for i, v in enumerate(vals):
                objs[i] = v
        self._exchange("broadcast_object_list", data, read)

    def broadcast(self, t, src=0, async_op=False):
        def read(got):
            if self._rank != src:
                _wait_events([got[src][1]], t.device)
                t.copy_(got[src][0])
            return _event(t)
        self._exchange("broadcast", (t, _event(t)), read, t.device)
        return _DONE if async_op else None

    def all_reduce(self, t, op="sum", async_op=False):
        """Sum (op 'sum', or torch.distributed.ReduceOp.SUM) of every rank's tensor, added in rank order (the
        same bits on every rank)."""
        if str(op).lower().split(".")[-1] not in ("sum", "redopttype.sum"):
            raise ValueError(f"loopback all_reduce: only op='sum' is served, got {op!r}")
        snap = t.clone()

        def read(got):
            _wait_events([g[1] for g in got], t.device)
            acc = got[0][0].clone()
            for src, _ in got[1:]:
                acc.add_(src)
            t.copy_(acc)
            return _event(t)
        self._exchange("all_reduce", (snap, _event(snap)), read, t.device)
        return _DONE if async_op else None

    def barrier(self):
        self._exchange("barrier", None, lambda got: None)


def _splits(s, rows, P, name):
    if s is None:
        if rows % P:
            raise ValueError(f"all_to_all_single: {name} not given and {rows} rows do not split evenly over {P} ranks")
        return [rows // P] * P
    s = [int(x) for x in s]
    if len(s) != P or sum(s) != rows or min(s) < 0:
        raise ValueError(f"all_to_all_single: {name} {s} do not split {rows} rows over {P} ranks")
    return s


def run(fn, world_size, *args, device=None, timeout=600.0):
    """Calls fn(rank, group, *args) on `world_size` threads of this process and returns their results in rank
    order. `device`: a CUDA device the threads make current (default: the current one when CUDA is
    available). `timeout`: seconds any rank may wait in one collective (None: no limit). An exception on a
    rank fails the run with that rank's error (the lowest rank's when several raise); the ranks stop instead
    of waiting."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: expected a positive integer, got {world_size!r}")
    if not callable(fn):
        raise ValueError(f"fn: expected a callable fn(rank, group, *args), got {type(fn).__name__}")
    world = _World(world_size, timeout)
    results = [None] * world_size
    errors = {}
    scope = f"loopback-{id(world)}"
    cuda_dev = None
    if device is not None:
        cuda_dev = torch.device(device)
        if cuda_dev.type != "cuda":
            cuda_dev = None
    elif torch.cuda.is_available():
        cuda_dev = torch.device("cuda", torch.cuda.current_device())

    def body(rank):
        _workspace.set_scope(f"{scope}-{rank}")
        try:
            if cuda_dev is not None:
                torch.cuda.set_device(cuda_dev)
            results[rank] = fn(rank, Group(world, rank), *args)
        except _Aborted:
            pass
        except BaseException as e:  # noqa: BLE001 - reported by run() as this rank's error
            errors[rank] = e
            world.fail(rank, e)
        finally:
            world.finish(rank)
            _workspace.set_scope(None)

    threads = [threading.Thread(target=body, args=(r,), name=f"cpsched-loopback-{r}", daemon=True)
               for r in range(world_size)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for r in range(world_size):
            _workspace.release_workspaces(scope=f"{scope}-{r}")
    if errors:
        r = min(errors)
        e = errors[r]
        if hasattr(e, "add_note"):
            e.add_note(f"(on rank {r} of a cpsched.torch.loopback run of {world_size} ranks)")
        raise e
    if world.failure is not None:
        raise world.failure[1]
    return results
