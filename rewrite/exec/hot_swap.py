"""A gear that tiers up: its ATen code serves its first calls, then the hot callable is built on the
caller's thread and serves every call after.

This is the default mode's tier-up on CUDA: the hot callable is the gear's CUDA graph, running
Inductor's kernels compiled for the gear's sizes (`exec.cuda_kernels`). The build starts on the first
call past the cold calls, so a graph that is called once (`rewrite.explain`, a one-off warm-up) never
compiles. A build that fails leaves the gear on its ATen code, with a note.

Why on the caller's thread, not a background one: an Inductor build traces with FX (``make_fx``, and
Inductor's pattern replacements), and FX tracing patches ``torch.nn.Module.__call__`` for the whole
process while it runs (pytorch/pytorch#126024). A build on another thread sent the caller's next module
call into the build's tracer: on an H200 every default-mode call after the tier-up began failed with
"Detected that you are using FX to symbolically trace a dynamo-optimized function". The CPU's tier-up
builds on the caller's thread too (`program.py`), and Dynamo compiles on the caller's thread: one stall,
on one call, the way every torch.compile backend compiles.

Concurrent callers: one of them builds (under Dynamo's compile lock, so the build never interleaves with
a Dynamo compile on another thread; Inductor's config is process-wide); the others run the ATen code
meanwhile, counted as ``tier_up_pending`` slow paths. How each gear stands (`state`: "cold",
"building", "hot", "failed") is what the report and the slow-path counts read.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger("rewrite")

__all__ = ["HotSwapGear"]


def _compile_lock():
    try:
        from torch._dynamo.convert_frame import compile_lock
    except ImportError:  # a torch without it: builds of one gear still run one at a time (the gear's lock)
        return threading.RLock()
    return compile_lock


class HotSwapGear:
    """One static graph: ``cold`` serves its first ``cold_calls`` calls; the next call runs ``build()`` and
    the hot callable it returns serves that call and every one after."""

    def __init__(self, name: str, cold: Callable, build: Callable[[], Callable], cold_calls: int,
                 note: Callable[[str], None], ledger=None):
        self.name = name
        self.cold = cold
        self.hot: Callable | None = None
        self.cold_calls = cold_calls
        self.calls = 0  # calls before it turned hot (not atomic: a count, not a promise)
        self.pending_calls = 0  # calls that ran cold because another thread was building
        self._build = build
        self._note = note
        self._ledger = ledger  # rewrite.ledger.Ledger: pending calls and a failed build are slow paths
        self._lock = threading.Lock()  # held by the one caller that builds, while it builds

    @property
    def state(self) -> str:
        if self.hot is not None:
            return "failed" if self.hot is self.cold else "hot"
        return "building" if self._lock.locked() else "cold"

    def __call__(self, *args):
        hot = self.hot
        if hot is not None:
            return hot(*args)
        self.calls += 1
        if self.calls <= max(self.cold_calls, 1):  # the first call is always cold: a graph called once never builds
            return self.cold(*args)
        if not self._lock.acquire(blocking=False):  # another caller is building: this call does not wait for it
            self.pending_calls += 1
            if self._ledger is not None:
                self._ledger.slow("tier_up_pending", f"graph {self.name}: its kernels are being built by another "
                                  "caller; the call ran its ATen code", "warm the model up on one thread before "
                                  "serving from several, or raise exec.tier_up_calls")
            return self.cold(*args)
        try:
            hot = self._hot()
        finally:
            self._lock.release()
        return hot(*args)

    def _hot(self) -> Callable:
        """The hot callable, built on this thread the first time (the gear's lock is held)."""
        if self.hot is None:
            t0 = time.perf_counter()
            try:
                with _compile_lock():
                    self.hot = self._build()
                self._note(f"graph {self.name} tiered up: its hot code was built on call {self.calls} in "
                           f"{time.perf_counter() - t0:.1f} s" + (f" ({self.pending_calls} calls of other threads "
                                                                  "ran its ATen code meanwhile)"
                                                                  if self.pending_calls else ""))
            except Exception as e:  # noqa: BLE001 - the ATen code is always correct; say why it stays
                self.hot = self.cold
                why = f"graph {self.name} keeps its ATen code: its tier-up build failed ({type(e).__name__}: {e})"
                self._note(why)
                if self._ledger is not None:
                    self._ledger.slow("tier_up_refused", why, "see the error; exec.cuda_kernels = 'aten' captures "
                                      "the ATen code instead")
        return self.hot
