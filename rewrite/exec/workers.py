"""A process-wide pool of worker threads that run the side streams of CPU multi-stream graphs.

A call of a multi-stream graph leases one idle worker per side stream for the duration of the
call (creating a worker only when none is idle), so calls running at the same time never share a
worker and cannot deadlock each other. Workers block on a queue while idle (no busy waiting), are
reused by every later call, and are stopped by `shutdown` (also run at interpreter exit).

How many threads (the bound `tests/test_threads_and_settings.py` holds): a compiled model owns at
most one worker per side stream (a stream scope other than the caller's) of its graph with the most
side streams, per thread calling it at the same time; nothing else in rewrite starts threads that
outlive a call. A call that fails, on any stream, returns its workers to the pool: failures never add
threads. A call that times out (``exec.stream_timeout_s``) leaves its stuck worker running until the
stuck op returns; that worker then exits instead of rejoining the pool (`abandoned`), so the pool
is back at its bound. A worker idle for `IDLE_SECONDS` exits (a model that stopped running scopes,
or whose scopes run on one stream, holds no threads for good); the next call starts one again.

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
IDLE_SECONDS = 60.0  # an idle worker exits after this long (the next call that needs one starts one)


class _Worker:
    _ids = itertools.count()

    def __init__(self, owner: "WorkerPool"):
        self.owner = owner
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.intra_op_threads: int | None = None
        self.thread = threading.Thread(target=self._loop, name=f"rewrite-stream-{next(self._ids)}", daemon=True)
        self.thread.start()

    def submit(self, fn, args, on_done, intra_op_threads: int, abandoned=None) -> None:
        """Run ``fn(*args)``, then ``on_done()``; ``abandoned()`` (if given) says, once ``fn`` has
        returned, whether the call that leased this worker gave up waiting for it (a timeout)."""
        self.inbox.put((fn, args, on_done, intra_op_threads, abandoned))

    def _loop(self) -> None:
        self.intra_op_threads = torch.get_num_threads()
        while True:
            try:
                task = self.inbox.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                if self.owner._retire_if_idle(self):
                    return
                continue  # leased just now: its task is on the way
            if task is _STOP:
                return
            fn, args, on_done, threads, abandoned = task
            if threads != self.intra_op_threads:
                with THREAD_COUNT_LOCK:
                    set_this_thread_intra_op_threads(threads)
                self.intra_op_threads = threads
            try:
                fn(*args)
            finally:
                if abandoned is not None and abandoned():
                    # Its call timed out and another worker took its place: leave, so the pool stays at its bound.
                    self.owner._retire(self)
                    on_done()
                    return
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

    def _retire(self, w: _Worker) -> None:
        with self._lock:
            if w in self._workers:
                self._workers.remove(w)
            if w in self._idle:
                self._idle.remove(w)
        log.debug("stream worker %s exits (%d in pool)", w.thread.name, len(self._workers))

    def _retire_if_idle(self, w: _Worker) -> bool:
        """Remove ``w`` if it is idle (not leased); a leased one stays (its task is coming)."""
        with self._lock:
            if w not in self._idle:
                return w not in self._workers  # shut down already: leave too
            self._idle.remove(w)
            self._workers.remove(w)
        log.debug("stream worker %s idle for %.0f s: exits (%d in pool)", w.thread.name, IDLE_SECONDS,
                  len(self._workers))
        return True

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
