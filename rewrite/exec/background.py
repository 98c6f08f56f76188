"""Builds off the caller's path: one worker thread per process makes what a tier-up needs while the
graph's ATen code serves the calls (TensorRT-RTX's background builds, which its callers pick up when
they are ready).

One daemon thread, started with the first build and kept for the process, runs the builds one at a
time in the order they come: a compiled model owns no thread of its own for this (the threads a
compiled model may own are listed in docs/streams.md). A process forked after a build started gets
a thread of its own on its first build. Builds take Dynamo's compile lock, so an Inductor compile here
never interleaves with a compile Dynamo runs on another thread (Inductor's config is process-wide).

At interpreter exit the builds still queued are cancelled and the one running is waited for (at most
``EXIT_WAIT_S``, then the exit goes on, with a warning): a daemon
thread stopped inside a C++ kernel build aborts the process ("terminate called without an active
exception"), which a torchrun rank exiting right after its last call did on a fresh kernel cache.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import logging
import os
import queue
import threading
from typing import Callable

log = logging.getLogger("rewrite")

__all__ = ["submit", "wait_for_builds"]

_lock = threading.Lock()
_idle = threading.Condition(_lock)
_queue: "queue.SimpleQueue | None" = None  # the build thread's; None until the first build
_pending = 0  # builds submitted and not finished
_exiting = False  # set at interpreter exit: builds not yet started are cancelled
EXIT_WAIT_S = 300.0  # how long exit waits for the build that is running (a wait is never unbounded)


def _after_fork_in_child() -> None:
    """A forked child has no build thread, and the lock may have been held by a thread it lacks."""
    global _lock, _idle, _queue, _pending
    _lock = threading.Lock()
    _idle = threading.Condition(_lock)
    _queue, _pending = None, 0


os.register_at_fork(after_in_child=_after_fork_in_child)


def _compile_lock():
    try:
        from torch._dynamo.convert_frame import compile_lock
    except ImportError:  # a torch without it: builds still run one at a time on the one thread
        return threading.RLock()
    return compile_lock


def _work(q: "queue.SimpleQueue") -> None:
    global _pending
    compile_lock = _compile_lock()
    while True:
        future, build = q.get()
        if _exiting:
            future.cancel()
        if future.set_running_or_notify_cancel():
            try:
                with compile_lock:
                    result = build()
            except BaseException as e:  # noqa: BLE001 - handed to whoever picks the build up
                future.set_exception(e)
            else:
                future.set_result(result)
        with _lock:
            _pending -= 1
            if _pending == 0:
                _idle.notify_all()


def submit(build: Callable[[], object]) -> concurrent.futures.Future:
    """Run ``build()`` on the process's build thread; its result (or error) arrives in the returned future."""
    global _queue, _pending
    future: concurrent.futures.Future = concurrent.futures.Future()
    with _lock:
        if _queue is None:
            _queue = queue.SimpleQueue()
            threading.Thread(target=_work, args=(_queue,), name="rewrite-build", daemon=True).start()
        _pending += 1
        _queue.put((future, build))
    return future


@atexit.register
def _finish_at_exit() -> None:
    global _exiting
    _exiting = True
    if not wait_for_builds(EXIT_WAIT_S):
        log.warning("rewrite: a background build still runs %.0f s after exit began; exiting without it",
                    EXIT_WAIT_S)


def wait_for_builds(timeout: float | None = None) -> bool:
    """Wait until every build submitted so far has finished; False if ``timeout`` seconds passed first.
    (For tests and benchmarks that want a model's tier-up done before they time it.)"""
    with _lock:
        return _idle.wait_for(lambda: _pending == 0, timeout)
