"""A gear that tiers up without making a caller wait: its ATen code serves the calls while its hot
callable is built on the process's build thread (`rewrite.exec.background`), and the first call
after both the cold calls and the build are done switches to it.

This is the default mode's tier-up on CUDA: the hot callable is the gear's CUDA graph, running
Inductor's kernels compiled for the gear's sizes (`exec.cuda_kernels`). An Inductor compile takes
seconds; on the caller's path that would be a stall of seconds in a serving loop, off it the calls go
on at eager speed meanwhile. The build starts on the gear's second call, so a graph that is called
once (`rewrite.explain`, a one-off warm-up) never compiles. A build that fails leaves the gear on its
ATen code, with a note. How each gear stands (`state`: "cold", "building", "hot", "failed"; calls it
served cold because its build was not ready: ``pending_calls``) is what the report and the slow-path
counts read.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from . import background

log = logging.getLogger("rewrite")

__all__ = ["HotSwapGear"]


class HotSwapGear:
    """One static graph: ``cold`` serves its first ``cold_calls`` calls and every call until ``build()``
    (run on the build thread) has returned the hot callable."""

    def __init__(self, name: str, cold: Callable, build: Callable[[], Callable], cold_calls: int,
                 note: Callable[[str], None], ledger=None):
        self.name = name
        self.cold = cold
        self.hot: Callable | None = None
        self.cold_calls = cold_calls
        self.calls = 0  # calls before it turned hot (not atomic: a count, not a promise)
        self.pending_calls = 0  # calls past the cold calls that ran cold because the build was not ready
        self._build = build
        self._future = None
        self._note = note
        self._ledger = ledger  # rewrite.ledger.Ledger: pending calls and a failed build are slow paths
        self._lock = threading.Lock()

    @property
    def state(self) -> str:
        if self.hot is not None:
            return "failed" if self.hot is self.cold else "hot"
        return "cold" if self._future is None else "building"

    def __call__(self, *args):
        hot = self.hot
        if hot is not None:
            return hot(*args)
        self.calls += 1
        if self._future is None and self.calls > 1:
            self._start()
        if self.cold_calls > 0 or self._future is None:  # a cold call, or the first: no build asked for yet
            self.cold_calls = max(self.cold_calls - 1, 0)  # not atomic: a few more cold calls, never fewer
            return self.cold(*args)
        if not self._future.done():
            self.pending_calls += 1
            if self._ledger is not None:
                self._ledger.slow("tier_up_pending", f"graph {self.name}: its kernels are still being built; the "
                                  "call ran its ATen code", "wait for the builds before serving "
                                  "(rewrite.exec.background.wait_for_builds()), or raise exec.tier_up_calls")
            return self.cold(*args)
        return self._take()(*args)

    def _start(self) -> None:
        with self._lock:
            if self._future is None:
                self._future = background.submit(self._build)

    def _take(self) -> Callable:
        with self._lock:
            if self.hot is None:
                try:
                    self.hot = self._future.result()
                    self._note(f"graph {self.name} tiered up: its hot code was built off the caller's path"
                               + (f" ({self.pending_calls} calls ran its ATen code while it was built)"
                                  if self.pending_calls else ""))
                except Exception as e:  # noqa: BLE001 - the ATen code is always correct; say why it stays
                    self.hot = self.cold
                    why = f"graph {self.name} keeps its ATen code: its tier-up build failed ({type(e).__name__}: {e})"
                    self._note(why)
                    if self._ledger is not None:
                        self._ledger.slow("tier_up_refused", why, "see the error; exec.cuda_kernels = 'aten' captures "
                                          "the ATen code instead")
            return self.hot

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for this gear's build (started if it was not); True when it is done."""
        self._start()
        try:
            self._future.result(timeout)
        except Exception:  # noqa: BLE001 - a failed build is done too; the next call says why
            pass
        return self._future.done()
