"""A pool of P worker processes joined by one gloo process group, reused by many test cases.

Spawning and joining a process group costs seconds, so each P gets one pool for the whole test session, and
every case is a function of `torch_cases` that each rank runs. Every call has a fixed timeout: when a rank
does not answer in time the pool is killed (so no test can hang) and the call raises PoolTimeout naming the
ranks that did not answer.
"""
from __future__ import annotations

import os
import queue
import socket
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))


class PoolTimeout(AssertionError):
    pass


class RankError(Exception):
    def __init__(self, rank, kind, message, tb):
        super().__init__(f"rank {rank}: {kind}: {message}\n{tb}")
        self.rank, self.kind, self.message = rank, kind, message


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, P, port, tasks, results):
    sys.path.insert(0, HERE)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=P)
        import torch_cases
    except BaseException as e:  # noqa: BLE001
        results.put((rank, False, (type(e).__name__, str(e), traceback.format_exc())))
        return
    results.put((rank, True, "ready"))
    while True:
        item = tasks.get()
        if item is None:
            break
        name, kw = item
        try:
            out = getattr(torch_cases, name)(rank=rank, P=P, **kw)
            results.put((rank, True, out))
        except BaseException as e:  # noqa: BLE001
            results.put((rank, False, (type(e).__name__, str(e), traceback.format_exc())))
    dist.destroy_process_group()


class Pool:
    def __init__(self, P, start_timeout=120):
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        self.P = P
        self.tasks = [ctx.Queue() for _ in range(P)]
        self.results = ctx.Queue()
        port = _free_port()
        self.procs = [ctx.Process(target=_worker, args=(r, P, port, self.tasks[r], self.results), daemon=True)
                      for r in range(P)]
        for p in self.procs:
            p.start()
        self.dead = False
        self._collect(start_timeout, "start")

    def _collect(self, timeout, what):
        import time
        got = {}
        deadline = time.monotonic() + timeout
        while len(got) < self.P:
            left = deadline - time.monotonic()
            try:
                rank, ok, payload = self.results.get(timeout=max(0.01, left))
            except queue.Empty:
                missing = [r for r in range(self.P) if r not in got]
                self.kill()
                raise PoolTimeout(f"{what}: ranks {missing} of P = {self.P} did not answer within {timeout} s "
                                  f"(the pool was killed)") from None
            got[rank] = (ok, payload)
        return [got[r] for r in range(self.P)]

    def run(self, name, timeout=120, **kw):
        """Runs torch_cases.<name>(rank=r, P=P, **kw) on every rank: [(ok, result or (type, msg, tb)), ...]."""
        if self.dead:
            raise PoolTimeout(f"the P = {self.P} pool was killed by an earlier timeout")
        for q in self.tasks:
            q.put((name, kw))
        return self._collect(timeout, name)

    def values(self, name, timeout=120, **kw):
        """As run, but raises the first rank's error (RankError) and returns the ranks' results."""
        out = self.run(name, timeout, **kw)
        for r, (ok, payload) in enumerate(out):
            if not ok:
                raise RankError(r, *payload)
        return [p for _, p in out]

    def kill(self):
        self.dead = True
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=5)

    def close(self):
        if self.dead:
            return
        for q in self.tasks:
            q.put(None)
        for p in self.procs:
            p.join(timeout=10)
        self.kill()


_POOLS = {}


def get_pool(P):
    """The session's pool of P ranks (started on first use, killed at exit)."""
    pool = _POOLS.get(P)
    if pool is None or pool.dead:
        pool = Pool(P)
        _POOLS[P] = pool
    return pool


def _close_all():
    for pool in _POOLS.values():
        try:
            pool.close()
        except Exception:  # noqa: BLE001
            pool.kill()


import atexit  # noqa: E402

atexit.register(_close_all)
