"""A process-wide pool of worker threads that run the side streams of CPU multi-stream graphs.

A call of a multi-stream graph leases one idle worker per side stream for the duration of the
call (creating a worker only when none is idle), so calls running at the same time never share a
worker and cannot deadlock each other. Workers block on a queue while idle (no busy waiting), are
reused by every later call, and are stopped by `shutdown` (also run at interpreter exit).

Intra-op threads: ``torch.set_num_threads`` sets the calling thread's OpenMP/MKL thread count and a
process-global default for threads that have not run a parallel op yet. A worker sets its own
count once (its share of the cores) and then puts the global default back, so the caller's
threads and threads created later keep torch's setting.
"""
from __future__ import annotations

import atexit
import itertools
import logging
import queue
import threading

import torch

from ..utils import THREAD_COUNT_LOCK

log = logging.getLogger("rewrite")

__all__ = ["WorkerPool", "pool", "shutdown"]

_STOP = object()


class _Worker:
    _ids = itertools.count()

    def __init__(self, owner: "WorkerPool", default_threads: int):
        self.owner = owner
        self.global_default = default_threads
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.intra_op_threads: int | None = None
        self.thread = threading.Thread(target=self._loop, name=f"rewrite-stream-{next(self._ids)}", daemon=True)
        self.thread.start()

    def submit(self, fn, args, on_done, intra_op_threads: int) -> None:
        self.inbox.put((fn, args, on_done, intra_op_threads))

    def _loop(self) -> None:
        # Run torch's lazy per-thread init now: run later, it would overwrite our setting.
        self.intra_op_threads = torch.get_num_threads()
        while True:
            task = self.inbox.get()
            if task is _STOP:
                return
            fn, args, on_done, threads = task
            if threads != self.intra_op_threads:
                _set_thread_local_intra_op_threads(threads, self.global_default)
                self.intra_op_threads = threads
            try:
                fn(*args)
            finally:
                # Back to the pool first, so the caller's next call finds this worker idle.
                self.owner._release(self)
                on_done()


def _set_thread_local_intra_op_threads(n: int, global_default: int) -> None:
    """Give the current thread ``n`` intra-op threads without changing torch's global default."""
    with THREAD_COUNT_LOCK:
        torch.set_num_threads(n)
        # set_num_threads also changed the default new threads start with: restore it from a
        # helper thread, whose own thread-local setting does not matter.
        restore = threading.Thread(target=torch.set_num_threads, args=(global_default,), daemon=True)
        restore.start()
        restore.join()


class WorkerPool:
    def __init__(self):
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._workers: list[_Worker] = []

    def lease(self, n: int, default_threads: int) -> list:
        """``n`` workers for the caller's exclusive use until each finishes its task.

        ``default_threads``: torch's thread count, which new workers put back after setting their
        own. The caller passes what it knows (not a count read now, which another call running
        at the same time may have changed for the moment).
        """
        with self._lock:
            got = [self._idle.pop() for _ in range(min(n, len(self._idle)))]
        while len(got) < n:
            w = _Worker(self, default_threads)
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
