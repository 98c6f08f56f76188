"""Running a geared graph: the input shape picks a static graph by one dict lookup.

The key is the tuple of the gear symbols' values, read straight off the inputs (a SymInt input
when the graph has one, else ``input.shape[dim]``). A key that is no gear goes to the fallback
``config.inference_config.gear_fallback`` names: an error (default), padding up to a larger gear,
or the symbolic graph.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import operator
from typing import Callable

from . import traffic as _recording

log = logging.getLogger("rewrite")

__all__ = ["GearSymbol", "GearDispatcher", "not_a_gear"]


@dataclasses.dataclass(frozen=True)
class GearSymbol:
    """One gear symbol: how to read it from the inputs and how to name it to the user."""

    symbol: object  # sympy.Symbol
    input_index: int  # tensor input whose size holds it
    dim: int
    label: str  # e.g. "input L['x'] dim 0"
    scalar_index: int | None = None  # a SymInt input carrying the same value, if the graph has one

    def reader(self) -> Callable:
        if self.scalar_index is not None:
            return operator.itemgetter(self.scalar_index)
        i, d = self.input_index, self.dim
        return lambda args: args[i].shape[d]


class GearDispatcher:
    """The callable a geared graph compiles to: ``fn(*inputs) -> outputs``."""

    def __init__(self, symbols: list[GearSymbol], table: dict, fallback: str,
                 dynamic_fn: Callable | None = None, padder=None, pad_refusal: str | None = None,
                 function: str = "", ledger=None):
        self.symbols = symbols
        self.table = table  # key (tuple of ints) -> compiled static graph
        self.fallback = fallback
        self.dynamic_fn = dynamic_fn
        self.padder = padder  # gears.padding.Padder, when padding was proven safe
        self.pad_refusal = pad_refusal  # why padding is not allowed, for the error
        self._readers = [s.reader() for s in symbols]
        self._misses: dict = {}  # key -> (slow path, callable that serves it, padded elements): padded runs
        self.ledger = ledger  # rewrite.ledger.Ledger: calls per gear, and every call no gear serves
        self._first_call = True
        # what `rewrite.gears.recording` counts each call's key under: the function and each symbol's dim
        self.streams = tuple(_recording.Stream(function, s.label) for s in symbols)

    @property
    def gears(self) -> list[tuple]:
        return list(self.table)

    def key(self, args) -> tuple:
        return tuple(read(args) for read in self._readers)

    def __call__(self, *args):
        if self._first_call:  # Dynamo has built its guards by now: set_dim_gears' flag can go
            from .spec import size_oblivious

            size_oblivious.restore()
            self._first_call = False
        key = tuple(read(args) for read in self._readers)
        recs = _recording.active
        if recs is not None:
            _recording.note(recs, self.streams, key)
        fn = self.table.get(key)
        if fn is None:
            return self._serve_miss(key, args)
        if self.ledger is not None:
            self.ledger.served(key)
        return fn(*args)

    def _serve_miss(self, key: tuple, args):
        """A call whose sizes are no gear: the fallback serves it, and the ledger counts it (strict: raises)."""
        kind, fn, padded = self._misses.get(key) or self._miss(key)
        if self.ledger is not None:
            if kind == "pads":
                self.ledger.slow("pads", f"{self._describe(key)} was padded by {padded} elements to a gear",
                                 "add a gear for this size (rewrite.gears.plan_gears picks gears from recorded traffic)",
                                 padded_rows=padded)
            else:
                self.ledger.slow("dynamic_fallbacks", f"{self._describe(key)} is no gear; the symbolic graph ran",
                                 "add a gear for this size, or gear_fallback='pad' to run the nearest larger gear")
        return fn(*args)

    def _miss(self, key: tuple) -> tuple:
        from .spec import GearError

        if self.fallback == "dynamic" and self.dynamic_fn is not None:
            return "dynamic_fallbacks", self.dynamic_fn, 0
        if self.fallback == "pad":
            if self.padder is not None:
                target = self._smallest_larger(key)
                if target is not None:
                    log.info("gears: shape %s is not a gear; padding up to gear %s", self._describe(key), target)
                    try:
                        fn = self.padder.make(key, target, self.table[target])
                    except GearError as e:  # known only now, with the sizes: say it as every refusal does
                        raise self._error(key, f"and padding is not possible: {e}") from None
                    entry = self._misses[key] = ("pads", fn, math.prod(target) - math.prod(key))
                    return entry
                raise self._error(key, "and no gear is larger in every padded dimension")
            raise self._error(key, f"and padding is not possible: {self.pad_refusal}")
        raise self._error(key, "")

    def _smallest_larger(self, key: tuple):
        """The gear with the fewest elements that is >= key everywhere (equal where padding is not allowed)."""
        best, best_size = None, None
        for gear in self.table:
            ok = all(g == k or (g > k and self.padder.can_pad(i)) for i, (g, k) in enumerate(zip(gear, key)))
            if ok:
                size = 1
                for g in gear:
                    size *= g
                if best is None or size < best_size:
                    best, best_size = gear, size
        return best

    def _describe(self, key: tuple) -> str:
        return _describe(self.symbols, key)

    def _error(self, key: tuple, why: str) -> "GearError":
        return not_a_gear(self.symbols, list(self.table), key, self.fallback, why)


def _describe(symbols: list[GearSymbol], key: tuple) -> str:
    return ", ".join(f"{s.label} = {v}" for s, v in zip(symbols, key))


def not_a_gear(symbols: list[GearSymbol], gears: list[tuple], key: tuple, fallback: str, why: str = ""):
    """The GearError for input sizes ``key`` that are no gear: the same at compile and at call time."""
    from .spec import GearError

    parts = []
    for i, (s, v) in enumerate(zip(symbols, key)):
        allowed = sorted({g[i] for g in gears})
        if v not in allowed:
            parts.append(f"{s.label} has size {v}; allowed gears for it: {allowed}")
    if not parts:  # every value is some gear's, but not this combination
        labels = ", ".join(s.label for s in symbols)
        parts.append(f"sizes ({_describe(symbols, key)}) are not a gear combination; gears of ({labels}): "
                     f"{sorted(gears)}")
    hint = "" if fallback != "error" else \
        " (set config.inference_config.gear_fallback to 'pad' or 'dynamic' to run other shapes)"
    return GearError("input shape is not one of the compiled gears: " + "; ".join(parts)
                     + (f" {why}" if why else "") + hint)
