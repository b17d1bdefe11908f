"""solve_async's Futures and the thread that resolves them."""
from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time

from ._result import Result


def _resolve(fut, handle):
    try:
        fut.set_result(Result(handle.get()))
    except BaseException as e:  # the solver's error belongs to the Future
        fut.set_exception(e)


def _run_callback(fn, fut):
    try:
        fn(fut)
    except Exception:  # as concurrent.futures does with a callback's error
        logging.getLogger("concurrent.futures").exception("exception calling callback for %r", fut)


class _AheadFuture(concurrent.futures.Future):
    """solve_async's Future. Its done-callbacks run on a thread of their own, never on the Session's one
    resolving thread: a callback that waits for another solve_async of the same Session (or solves more)
    would otherwise hold the very thread that must resolve it, and wait forever. A callback added once the
    Future is done runs at once in the caller's thread, as with any Future."""

    def add_done_callback(self, fn):
        if self.done():
            return super().add_done_callback(fn)  # (runs it now, here)
        super().add_done_callback(lambda f: threading.Thread(target=_run_callback, args=(fn, f),
                                                             name="cpsched-ahead-callback", daemon=True).start())


class _AheadWaiter:
    """One daemon thread per Session that resolves solve_async's Futures in the order the masks were queued
    (the C++ queue solves them in that order); it holds no reference to the Session and ends after the
    Session is collected (the Futures still waiting then fail: the Session closed)."""

    def __init__(self):
        self._q = queue.SimpleQueue()
        threading.Thread(target=self._run, name="cpsched-ahead", daemon=True).start()

    def put(self, fut, handle):
        self._q.put((fut, handle))

    def _run(self):
        while True:
            item = self._q.get()
            if item is None:
                return
            # Wait here, not inside the extension: the interpreter's exit ends a daemon thread when it takes the
            # GIL back, and from inside C++ (a blocking get() with the GIL released) that end is std::terminate,
            # the process aborted with an in-flight plan. Sleeping is CPython's own and safe there; a few ms of
            # latency on a Future whose mask takes tens.
            delay = 0.0005
            while not item[1].done():
                time.sleep(delay)
                delay = min(2 * delay, 0.005)
            _resolve(*item)  # (get() of a done solve keeps the GIL)
            del item  # no reference to the last Future or handle while waiting

    def close(self):
        self._q.put(None)
