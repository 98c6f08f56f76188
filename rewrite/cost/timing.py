"""The one way the cost model times a kernel: the fastest of a few short batches.

Both the rates (`rewrite.cost.calibration`) and the kernels at a graph's own shapes
(`rewrite.cost.kernel_times`) are timed here. On a shared machine other work only ever adds time (a
thread pool waiting for a busy core can take ten times as long), and a burst of it hits a few
batches of every function, not all batches of one: the fastest batch is the closest to the
kernel's own time.
"""
from __future__ import annotations

import math
import time

__all__ = ["fastest"]

MIN_BATCHES = 3  # even a slow kernel is timed this often: one batch alone may have been preempted


def fastest(fns: list, budget_s: float, batches: int) -> list[float]:
    """Seconds per call of each of ``fns`` (about ``budget_s`` seconds each): the fastest of up to
    ``batches`` short batches (at least `MIN_BATCHES`), the functions taking turns.

    Each function is called once untimed first (first-call allocations, oneDNN primitive
    creation), then once timed, to size its batches."""
    plan = []
    for fn in fns:
        fn()
        t0 = time.perf_counter()
        fn()
        one = max(time.perf_counter() - t0, 1e-7)
        turns = max(MIN_BATCHES, min(batches, int(budget_s / one)))
        plan.append((fn, max(1, int(budget_s / turns / one)), turns))
    best = [math.inf] * len(fns)
    for turn in range(max((turns for _, _, turns in plan), default=0)):
        for i, (fn, n, turns) in enumerate(plan):
            if turn >= turns:
                continue
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best[i] = min(best[i], (time.perf_counter() - t0) / n)
    return best
