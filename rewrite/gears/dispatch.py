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
import threading
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


# The fix each slow path of a call no gear serves names (rewrite.ledger)
_ADD_A_GEAR = "add a gear for this size (rewrite.gears.plan_gears picks gears from recorded traffic)"
_FIXES = {"pads": _ADD_A_GEAR, "splits": _ADD_A_GEAR,
          "dynamic_fallbacks": "add a gear for this size, or gear_fallback='pad' to run the nearest larger gear",
          "tokens_computed": "see the reason; padded_tokens='skip' needs gear_fallback 'pad' or 'fit' and an attention "
                             "mask the padding proof relies on alone (rewrite.gears.regroup)"}


_MAX_PADDED = 4096  # (key, gear) pairs whose padded callables are kept: bounded, sizes are unbounded


class GearDispatcher:
    """The callable a geared graph compiles to: ``fn(*inputs) -> outputs``."""

    def __init__(self, symbols: list[GearSymbol], table: dict, fallback: str,
                 dynamic_fn: Callable | None = None, padder=None, pad_refusal: str | None = None,
                 function: str = "", ledger=None, regrouper=None, regroup_refusal: str | None = None,
                 build_dynamic: Callable | None = None):
        self.symbols = symbols
        self.table = table  # key (tuple of ints) -> compiled static graph
        self.fallback = fallback
        self.dynamic_fn = dynamic_fn
        # gear_fallback="fit": the symbolic graph, built the first time fit picks it (`_fit_dynamic`)
        self._build_dynamic = build_dynamic
        self._build_lock = threading.Lock()
        self.padder = padder  # gears.padding.Padder, when padding was proven safe
        self.pad_refusal = pad_refusal  # why padding is not allowed, for the error
        self._readers = [s.reader() for s in symbols]
        from .padding import tied_positions

        self._axes = tied_positions(list(table), len(symbols))
        self._misses: dict = {}  # key -> (slow path, callable that serves it, padded elements, message): misses
        # gear_fallback="fit": each gear's measured latency decides between padding and splitting (gears.fit)
        self.latency = None
        if fallback == "fit":
            from .fit import GearLatency

            self.latency = GearLatency()
            self._decided = (0, 0)  # (latency version, misses) when the cached decisions were made
        self.ledger = ledger  # rewrite.ledger.Ledger: calls per gear, and every call no gear serves
        # padded_tokens="skip": each call's rows run in groups cut to their own length (gears.regroup), or why not
        self.regrouper = regrouper
        self.regroup_refusal = regroup_refusal
        self._regroup_calls = 0
        self._padded: dict = {}  # (key, gear) -> its `_pad_entry`: regrouped calls' runs padded to a gear
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
            if self.regroup_refusal and self.ledger is not None:
                self.ledger.slow("tokens_computed", self.regroup_refusal, _FIXES["tokens_computed"])
        key = tuple(read(args) for read in self._readers)
        recs = _recording.active
        if recs is not None:
            _recording.note(recs, self.streams, key)
        if self.regrouper is not None:
            runs = self._regrouped(key, args)
            if runs is not None:
                return self.regrouper.serve(args, key, runs, self._run_at)
        return self._run(key, args)

    def _run(self, key: tuple, args):
        """Serve a call of ``key``: its gear, or the fallback."""
        fn = self.table.get(key)
        if fn is None:
            return self._serve_miss(key, args)
        if self.ledger is not None:
            self.ledger.served(key)
        if self.latency is not None:
            return self.latency.timed(key, fn, args)
        return fn(*args)

    def _regrouped(self, key: tuple, args) -> list | None:
        """The gear calls (`rewrite.gears.regroup.Run`) a call runs as, or None to run it as it is. Every call no gear
        serves is planned here too (even with no padding to skip): the plan weighs every sequence gear that holds it,
        where the fallback pads to the smallest."""
        from .fit import REDECIDE_EVERY

        rg = self.regrouper
        b, n = key[rg.batch[0]], key[rg.seq[0]]
        lengths = rg.lengths(args, b, n)
        if min(lengths) == n and key in self.table:
            return None  # a gear's own call, no row padded at its end: runs as it is
        self._regroup_calls += 1
        version = (self.latency.version if self.latency is not None else 0, self._regroup_calls // REDECIDE_EVERY)
        cost = rg.costs(key, version, self._predicted, self.fallback == "fit")
        runs = rg.plan(lengths, key, cost)
        if runs is None or self.ledger is None:
            return runs
        skipped = b * n - sum((b if r.rows is None else len(r.rows)) * r.length for r in runs)
        if skipped:
            self.ledger.regrouped(skipped)
        splits = {(r.length, r.gear) for r in runs if r.split}
        if splits:
            self.ledger.slow("splits", f"{self._describe(key)}: a group of rows at length "
                             f"{', '.join(str(length) for length, _ in sorted(splits))} ran as several gears' calls",
                             _FIXES["splits"])
        return runs

    def _run_at(self, key: tuple, gear: tuple, args):
        """Serve a call of ``key`` with ``gear``, padded up to it where larger (counted; timed under the gear)."""
        if key == gear:
            return self._run(key, args)
        entry = self._padded.get((key, gear))
        if entry is None:
            from .spec import GearError

            try:
                entry = self._pad_entry(key, gear)
            except GearError as e:  # known only now, with the sizes: the fallback serves it
                log.info("gears: %s cannot be padded to gear %s: %s", self._describe(key), gear, e)
                return self._run(key, args)
            if len(self._padded) >= _MAX_PADDED:
                self._padded.clear()
            self._padded[(key, gear)] = entry
        kind, fn, padded, message = entry
        if self.ledger is not None:
            self.ledger.slow(kind, message, _FIXES[kind], padded_rows=padded)
        return fn(*args)

    def _serve_miss(self, key: tuple, args):
        """A call whose sizes are no gear: the fallback serves it, and the ledger counts it (strict: raises)."""
        if self.latency is not None:
            self._forget_stale_decisions()
        kind, fn, padded, message = self._misses.get(key) or self._miss(key)
        if self.ledger is not None:
            self.ledger.slow(kind, message, _FIXES[kind], padded_rows=padded)
        return fn(*args)

    def _forget_stale_decisions(self) -> None:
        """Fit's decisions are made again once a gear has its first measurement, and every few hundred misses."""
        from .fit import REDECIDE_EVERY

        version, misses = self._decided
        if self.latency.version != version or misses >= REDECIDE_EVERY:
            self._misses.clear()
            self._decided = (self.latency.version, 0)
        else:
            self._decided = (version, misses + 1)

    def _miss(self, key: tuple) -> tuple:
        from .spec import GearError

        if self.fallback == "dynamic" and self.dynamic_fn is not None:
            entry = self._misses[key] = ("dynamic_fallbacks", self.dynamic_fn, 0,
                                         f"{self._describe(key)} is no gear; the symbolic graph ran")
            return entry
        if self.fallback == "fit" and self.padder is not None:
            entry = self._fit(key)
            if entry is not None:
                self._misses[key] = entry
                return entry
        if self.fallback in ("pad", "fit"):
            why = f"and padding is not possible: {self.pad_refusal}"
            if self.padder is not None:
                target = self._smallest_larger(key)
                why = "and no gear is larger in every padded dimension"
                if target is not None:
                    log.info("gears: shape %s is not a gear; padding up to gear %s", self._describe(key), target)
                    try:
                        entry = self._misses[key] = self._pad_entry(key, target)
                        return entry
                    except GearError as e:  # known only now, with the sizes: say it as every refusal does
                        why = f"and padding is not possible: {e}"
            if self.dynamic_fn is not None:  # a declared range: every size in it runs, dynamically where not padded
                entry = self._misses[key] = ("dynamic_fallbacks", self.dynamic_fn, 0,
                                             f"{self._describe(key)} is no gear; the symbolic graph ran")
                return entry
            raise self._error(key, why)
        raise self._error(key, "")

    def _fit(self, key: tuple):
        """The cheapest of padding to one gear and splitting along one gear axis (each other size padded up to some
        gear's), by the gears' measured latency (`rewrite.gears.fit`); None when neither is possible."""
        from .fit import Splitter, plan_fit
        from .spec import GearError

        measured = self.latency.measured()  # one snapshot for every price below (fit always measures)
        seconds = self._predicted(measured)
        larger = [g for g in self.table if self._holds(g, key, range(len(key)))]
        best = min(((seconds[g], None, g, None) for g in larger), default=None)  # (seconds, axis, plan, elsewhere)
        for axis in self._axes:
            if not all(self.padder.can_split(p) for p in axis) or len({self.padder.plan_of(p) for p in axis}) > 1:
                continue  # an axis of several symbols splits only where they were proven as one size
            # the gears that hold the call's other sizes (padded up where they are larger), by those sizes
            rest = [p for p in range(len(key)) if p not in axis]
            by_rest: dict = {}
            for g in self.table:
                if self._holds(g, key, rest):
                    by_rest.setdefault(tuple(g[p] for p in rest), {})[g[axis[0]]] = seconds[g]
            for elsewhere, sizes in by_rest.items():
                plan = plan_fit(key[axis[0]], list(sizes), sizes)
                if plan is not None and plan.split and (best is None or plan.seconds < best[0]):
                    best = (plan.seconds, axis, plan, dict(zip(rest, elsewhere)))
        dynamic = self._fit_dynamic(key, None if best is None else best[0], measured)
        if dynamic is not None:
            return dynamic
        if best is None:
            return None
        _, axis, plan, elsewhere = best
        if axis is None:  # padding to one gear is the cheapest
            try:
                return self._pad_entry(key, plan)
            except GearError as e:
                log.info("gears: %s cannot be padded to gear %s: %s", self._describe(key), plan, e)
                return None
        try:
            fn = Splitter(self.padder, axis, key, plan.parts, self.table, elsewhere)
        except GearError as e:
            log.info("gears: %s cannot be split: %s", self._describe(key), e)
            return None
        gear_rows = sum(g for _, g in plan.parts)
        padded = (self._elements(tuple(elsewhere.get(p, gear_rows) for p in range(len(key)))) - self._elements(key))
        ran = " + ".join(str(g) if rows == g else f"{g} ({g - rows} padded)" for rows, g in plan.parts)
        log.info("gears: shape %s is not a gear; split into gears %s", self._describe(key), ran)
        grown = [f"{self.symbols[p].label} padded to {v}" for p, v in elsewhere.items() if v != key[p]]
        return ("splits", fn, padded, f"{self._describe(key)} ran as gears {ran} of {self.symbols[axis[0]].label}"
                + (f" ({', '.join(grown)})" if grown else ""))

    def _fit_dynamic(self, key: tuple, gears_seconds: float | None, measured: dict):
        """The miss entry running ``key`` on the symbolic graph when its predicted latency (`GearLatency.
        dynamic_seconds`, against the gears' line through ``measured``, the snapshot ``gears_seconds`` was priced
        on) is below ``gears_seconds`` (the best of padding and splitting; None: neither is possible), else None.
        The symbolic graph is built the first time it wins; each of its calls is timed."""
        if self._build_dynamic is None and self.dynamic_fn is None:
            return None
        from .fit import gear_line

        elements = self._elements(key)
        line = gear_line(list(self.table), measured, self._elements)
        if gears_seconds is not None and self.latency.dynamic_seconds(elements, line) >= gears_seconds:
            return None
        if self.dynamic_fn is None:
            with self._build_lock:
                if self.dynamic_fn is None and self._build_dynamic is not None:
                    log.info("gears: building the symbolic graph (gear_fallback='fit' found it cheaper than the gears "
                             "for %s)", self._describe(key))
                    try:
                        self.dynamic_fn = self._build_dynamic()
                    except Exception as e:  # noqa: BLE001 - a candidate only: the gears still serve every size
                        log.warning("gears: the symbolic graph could not be built, fit pads and splits only: %s", e)
                    self._build_dynamic = None
            if self.dynamic_fn is None:
                return None
        fn, latency = self.dynamic_fn, self.latency

        def timed(*args):
            return latency.timed_dynamic(elements, fn, args)

        return ("dynamic_fallbacks", timed, 0, f"{self._describe(key)} is no gear; the symbolic graph ran it as it "
                "is (fit: cheaper than padding or splitting, by measured latency)")

    def _pad_entry(self, key: tuple, gear: tuple) -> tuple:
        """The miss entry of ``key`` padded up to ``gear``: ("pads", callable, padded elements, message); the
        callable is timed under the gear when the fallback measures gears. Raises GearError where it cannot pad."""
        fn = self.padder.make(key, gear, self.table[gear])
        if self.latency is not None:
            latency, padded_fn = self.latency, fn

            def fn(*args):
                return latency.timed(gear, padded_fn, args)
        padded = self._elements(gear) - self._elements(key)
        return ("pads", fn, padded, f"{self._describe(key)} was padded by {padded} elements to a gear")

    def _predicted(self, measured: dict | None = None) -> dict:
        """Each gear's predicted seconds (`rewrite.gears.fit.predicted_seconds`) from ``measured`` (the gears'
        latency, `GearLatency.measured`; None: a snapshot taken now)."""
        from .fit import predicted_seconds

        if measured is None:
            measured = self.latency.measured() if self.latency is not None else {}
        if self.latency is None:
            return predicted_seconds(list(self.table), measured, self._elements)
        return predicted_seconds(list(self.table), measured, self._elements, self.latency.unsettled())

    def _elements(self, key: tuple) -> int:
        """The elements a call of ``key`` runs: the product of its gear axes' sizes (one gear axis the trace kept as
        several symbols, a model's input_ids and attention_mask batch, counted once)."""
        return math.prod(key[group[0]] for group in self._axes)

    def _holds(self, gear: tuple, key: tuple, positions) -> bool:
        """``gear`` holds a call of ``key`` at ``positions``: the same size, or larger where that size may pad."""
        return all(gear[p] == key[p] or (gear[p] > key[p] and self.padder.can_pad(p)) for p in positions)

    def _smallest_larger(self, key: tuple):
        """The gear with the fewest elements that is >= key everywhere (equal where padding is not allowed)."""
        best, best_size = None, None
        for gear in self.table:
            if self._holds(gear, key, range(len(key))):
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
