"""CPU stream scopes under tier-up: keep worker threads only where they pay, measured on the caller's calls.

On CPU a graph with stream scopes (or `exec.auto_streams` branches) runs its branches on worker
threads, each with ATen code. The same graph on one stream tiers up in the default mode: planned
memory and static C kernels, often several times faster than the threads win back on a few cores
(issue 28: two chains of six 384x384 matmul+tanh took 16.9 ms with two scopes, 6.96 ms on one
stream tiered up). A scope must never make a graph slower than the same graph without it, and
which form wins depends on the machine, the sizes and the branches, so it is measured:

1. the first calls run the one-stream gear, which counts them and tiers up as any static graph does;
2. once it has tiered up, `TRIALS` calls of each form alternate, timed on the caller's calls;
3. the faster median is kept for good, and the report says which and by how much.

A one-stream gear that cannot tier up (no plan, no kernels: `PlannedProgram` says why) leaves the
graph on its worker threads, as before. So does a timeout the user set (``exec.stream_timeout_s`` at
a value of their own): only the worker threads watch a stream, and on one stream a stuck op would
simply run on, so such a graph never gets this choice (`rewrite.exec.stream_timeout_asked`).
"""
from __future__ import annotations

import logging
import statistics
import threading
import time

log = logging.getLogger("rewrite")

__all__ = ["StreamChoice", "TRIALS"]

TRIALS = 5  # timed calls of each form before the choice


class StreamChoice:
    """Calls ``threaded`` (the multi-stream executor) or ``one_stream`` (a tiering-up gear), whichever is faster."""

    def __init__(self, graph_name: str, threaded, one_stream, note):
        self.graph_name = graph_name
        self.threaded = threaded
        self.one_stream = one_stream  # exec.program._Gear: ``run`` is set once it has tiered up
        self.note = note
        self.chosen = None
        self.times: dict[str, list[float]] = {"threads": [], "one stream": []}
        self.lock = threading.Lock()

    def __call__(self, *args):
        chosen = self.chosen
        if chosen is not None:
            return chosen(*args)
        if self.one_stream.run is None:  # still counting its cold calls, or its tier-up was put off
            return self.one_stream(*args)
        with self.lock:
            threads, one = self.times["threads"], self.times["one stream"]
            form = "threads" if len(threads) <= len(one) else "one stream"
        fn = self.threaded if form == "threads" else self.one_stream
        t0 = time.perf_counter()
        out = fn(*args)
        elapsed = time.perf_counter() - t0
        with self.lock:
            self.times[form].append(elapsed)
            if self.chosen is None and min(len(v) for v in self.times.values()) >= TRIALS:
                self._choose()
        return out

    def _choose(self) -> None:
        threads = statistics.median(self.times["threads"])
        one = statistics.median(self.times["one stream"])
        if threads < one:
            self.chosen, kept = self.threaded, "worker threads"
        else:
            self.chosen, kept = self.one_stream, "one stream (tiered up)"
        self.note(f"graph {self.graph_name}: stream scopes on CPU: worker threads {threads * 1e3:.3f} ms, one stream "
                  f"tiered up {one * 1e3:.3f} ms per call (medians of {TRIALS}); kept {kept}")
