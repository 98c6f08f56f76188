"""Frozen weights that never go stale: a graph compiled with its weights as constants checks, on every call,
that the weights the caller passes are still the ones it froze, and compiles again with the new values when
they are not.

A frozen graph computes with the values its weights had when it was compiled (folded, transposed, packed for
oneDNN). Inductor's ``freezing`` leaves it to the user never to change them after; here a change is seen:
each call compares every frozen weight's version counter (bumped by every in-place write: ``load_state_dict``,
``p.copy_(...)``, an optimizer step) and data pointer (``p.data = new``) with those at compile time, about
5 us per 100 weights, and a changed weight makes the graph be compiled again with the new values: a slow path
counted in ``rewrite.stats(...).refreezes`` (``config.strict`` raises instead). A write through ``p.data``
(``p.data.copy_(...)``) bumps no version counter that the weight shares, as autograd's own checks do not see
it either: assign ``p.data = ...`` or write under ``torch.no_grad()`` instead.
"""
from __future__ import annotations

import threading
from typing import Callable

import torch

__all__ = ["FrozenGraph"]

_FIX = ("load the weights before compiling, or set experimental_config.frozen_parameter = False for weights "
        "that change between calls")


def _state(tensor: torch.Tensor) -> tuple:
    return tensor._version, tensor.data_ptr()


class FrozenGraph:
    """``fn(*args)``, a graph compiled with ``args[i]`` frozen to ``frozen[i]``; compiled again by
    ``rebuild(new_frozen) -> fn`` when a call passes weights that changed since."""

    def __init__(self, fn: Callable, frozen: dict, rebuild: Callable, ledger=None, name: str = "graph"):
        self.fn = fn
        self.indices = tuple(frozen)
        self._snapshot = [_state(t) for t in frozen.values()]
        self._rebuild = rebuild
        self._ledger = ledger
        self._name = name
        self._lock = threading.Lock()

    def __call__(self, *args):
        if [_state(args[i]) for i in self.indices] != self._snapshot:
            self._refreeze(args)
        return self.fn(*args)

    def changed(self, args) -> list[int]:
        """The argument positions whose weights differ from the frozen ones."""
        return [i for i, s in zip(self.indices, self._snapshot) if _state(args[i]) != s]

    def _refreeze(self, args) -> None:
        with self._lock:  # one rebuild when several threads see the change at once
            changed = self.changed(args)
            if not changed:
                return
            if self._ledger is not None:
                self._ledger.slow("refreezes", f"{self._name}: {len(changed)} frozen weight(s) changed since the "
                                  "graph was compiled; it was compiled again with their new values", _FIX)
            frozen = {i: args[i] for i in self.indices}
            self.fn = self._rebuild(frozen)
            self._snapshot = [_state(t) for t in frozen.values()]
