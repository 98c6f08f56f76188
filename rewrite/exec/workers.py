"""A process-wide pool of worker threads that run the side streams of CPU multi-stream graphs.

A call of a multi-stream graph leases one idle worker per side stream for the duration of the
call (creating a worker only when none is idle), so calls running at the same time never share a
worker and cannot deadlock each other. Workers block on a queue while idle (no busy waiting), are
reused by every later call, and are stopped by `shutdown` (also run at interpreter exit).

Intra-op threads: a worker sets its own count once (its share of the cores) with
`utils.set_this_thread_intra_op_threads`, which leaves the count threads created later start with
as it was.
"""
from __future__ import annotations

import atexit
import itertools
import logging
import queue
import threading

import torch

from ..utils import THREAD_COUNT_LOCK, set_this_thread_intra_op_threads

log = logging.getLogger("rewrite")

__all__ = ["WorkerPool", "pool", "shutdown"]

_STOP = object()


class _Worker:
    _ids = itertools.count()

    def __init__(self, owner: "WorkerPool"):
        self.owner = owner
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.intra_op_threads: int | None = None
        self.thread = threading.Thread(target=self._loop, name=f"rewrite-stream-{next(self._ids)}", daemon=True)
        self.thread.start()

    def submit(self, fn, args, on_done, intra_op_threads: int) -> None:
        self.inbox.put((fn, args, on_done, intra_op_threads))

    def _loop(self) -> None:
        self.intra_op_threads = torch.get_num_threads()
        while True:
            task = self.inbox.get()
            if task is _STOP:
                return
            fn, args, on_done, threads = task
            if threads != self.intra_op_threads:
                with THREAD_COUNT_LOCK:
                    set_this_thread_intra_op_threads(threads)
                self.intra_op_threads = threads
            try:
                fn(*args)
            finally:
                # Back to the pool first, so the caller's next call finds this worker idle.
                self.owner._release(self)
                on_done()


class WorkerPool:
    def __init__(self):
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._workers: list[_Worker] = []

    def lease(self, n: int) -> list:
        """``n`` workers for the caller's exclusive use until each finishes its task."""
        with self._lock:
            got = [self._idle.pop() for _ in range(min(n, len(self._idle)))]
        while len(got) < n:
            w = _Worker(self)
            with self._lock:
                self._workers.append(w)
            log.debug("started stream worker %s (%d in pool)", w.thread.name, len(self._workers))
            got.append(w)
        return got

    def _release(self, w: _Worker) -> None:
        with self._lock:
            if w in self._workers:
                self._idle.append(w)

    @property
    def size(self) -> int:
        return len(self._workers)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the idle workers and wait for them to exit (busy ones stop after their task)."""
        with self._lock:
            workers, self._workers, self._idle = self._workers, [], []
        for w in workers:
            w.inbox.put(_STOP)
        for w in workers:
            w.thread.join(timeout)


pool = WorkerPool()


def shutdown() -> None:
    """Stop every stream worker thread (they are started again on demand)."""
    pool.shutdown()


atexit.register(shutdown)
