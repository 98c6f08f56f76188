"""``gear_fallback="fit"``: serve a size that is no gear by padding it or by splitting it into gears' runs,
whichever the gears' measured latency says is cheaper.

A graph proven to keep the rows of a gear axis apart (`rewrite.gears.padding`) can run any number of rows as
parts: 37 rows with gears [1, 4, 8, 32] run as 32 + 4 + 1, or as 32 + 8 with 3 rows padded, or padded to a
larger gear if there is one. Each part runs a gear's static graph on a slice of the inputs along that axis
(the last part padded when it is no gear), and the outputs' rows are joined in one buffer per output. Beyond
the largest gear only splitting serves a call at all.

The choice is made by the latency each gear was measured to take, on the calls it served (`GearLatency`:
the least of its last few calls, timed only when the fallback is "fit"); a gear not measured yet is priced from
the measured ones by rows (a fixed cost per call plus a cost per row, fitted to them robustly, so that one slow
figure moves it little), or, before any measurement, as its rows plus an eighth of the largest gear's (the fixed
cost of a call). A gear measured only a few times is priced at the lower of its figure and the fitted one, so
that one busy moment does not keep it out of every plan (and so from being timed again). Decisions are cached
per size and made again as measurements come in.

The symbolic graph (the one every gear was made from) is a candidate too: it runs any size as it is, with no
padding, at about a gear's speed (MiniLM, 4 x 207 tokens: 131 ms, against 125 for a gear of that very size and 476
for the 11 x 252 gear the nearest pair offered). Its price is a line fitted to its own measured calls by
elements; before two of them, the gears' line times `DYNAMIC_GUESS`, so that it is first tried where the gears
would more than double a call's work. A size the gears cover badly then runs as it is, and a well-covered one
stays on the gears.
"""
from __future__ import annotations

import collections
import dataclasses
import statistics
import threading
import time

import torch

from ..ir import SymMeta
from .padding import Row, size_output

__all__ = ["GearLatency", "FitPlan", "plan_fit", "predicted_seconds", "Splitter", "REDECIDE_EVERY", "DYNAMIC_GUESS",
           "gear_line"]

_WINDOW = 8  # a gear's latency: the least of its last calls (a moving average kept a contended call for long)
_SKIP_FIRST = 2  # a gear's first calls (warm-up, tier-up builds) are not measured
_MOVED = 0.75  # an estimate that moved past this factor since decisions were made makes them stale
REDECIDE_EVERY = 256  # calls between fresh decisions for the sizes no gear serves
# The symbolic graph's price before it was measured, as a factor of the gears' line: a guess on the slow side, so
# that it is tried first only where the gears would do more than twice a call's work (measured on MiniLM at 4-24
# rows x 155-207 tokens: 0.95-1.15x a gear of the same size); once measured, its own line prices it
DYNAMIC_GUESS = 2.0


class GearLatency:
    """Seconds per call of each gear: the least of its last `_WINDOW` calls (every call it ran, padded or not); a
    call slowed by something else on the machine (a background build, another process) is not its latency, and
    a gear called rarely would keep such a figure for long in an average. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._seen: dict = {}
        self._recent: dict = {}  # gear -> deque of its last calls' seconds
        self._decided: dict = {}  # gear -> its estimate when `version` last moved for it
        self._dynamic = collections.deque(maxlen=4 * _WINDOW)  # the symbolic graph's calls: (elements, seconds)
        self._dynamic_calls = 0
        self.version = 0  # bumped when a gear's estimate is new or moved far: cached decisions are stale

    def record(self, gear: tuple, seconds: float) -> None:
        with self._lock:
            n = self._seen[gear] = self._seen.get(gear, 0) + 1
            if n <= _SKIP_FIRST:
                return
            recent = self._recent.setdefault(gear, collections.deque(maxlen=_WINDOW))
            recent.append(seconds)
            now, then = min(recent), self._decided.get(gear)
            if then is None or not _MOVED * then <= now <= then / _MOVED:
                self.version += 1
                self._decided[gear] = now

    def timed(self, gear: tuple, fn, args):
        t0 = time.perf_counter()
        out = fn(*args)
        self.record(gear, time.perf_counter() - t0)
        return out

    def record_dynamic(self, elements: int, seconds: float) -> None:
        """A call of the symbolic graph: ``elements`` (the product of the gear axes' sizes) took ``seconds``."""
        with self._lock:
            self._dynamic_calls += 1
            if self._dynamic_calls <= _SKIP_FIRST:  # its first calls build what its later calls reuse
                return
            self._dynamic.append((elements, seconds))
            if len(self._dynamic) <= 2:  # its first measurements replace the guess: decisions are stale
                self.version += 1

    def timed_dynamic(self, elements: int, fn, args):
        t0 = time.perf_counter()
        out = fn(*args)
        self.record_dynamic(elements, time.perf_counter() - t0)
        return out

    def dynamic_seconds(self, elements: int, gear_line) -> float:
        """The symbolic graph's predicted seconds for a call of ``elements``: a line through its measured calls, or,
        before two of them, ``gear_line(elements)`` (the gears' own price there) times `DYNAMIC_GUESS`."""
        with self._lock:
            points = list(self._dynamic)
        if len({e for e, _ in points}) < 2:
            return DYNAMIC_GUESS * gear_line(elements)
        fixed, per_element = _line(points, elements)
        return fixed + per_element * elements

    def measured(self) -> dict:
        with self._lock:
            return {g: min(r) for g, r in self._recent.items()}

    def unsettled(self) -> set:
        """The measured gears with fewer than `_WINDOW` measurements: their least may still be a busy moment's."""
        with self._lock:
            return {g for g, r in self._recent.items() if len(r) < _WINDOW}


def predicted_seconds(gears: list, measured: dict, rows_of, unsettled=frozenset()) -> dict:
    """Each gear's predicted seconds: measured, else fitted from the measured ones (fixed + per-row cost). A gear
    in ``unsettled`` (measured a few times only) is priced at the lower of its figure and the fit's: a gear timed
    once while the machine was busy would otherwise be avoided, and so never timed again."""
    line = gear_line(gears, measured, rows_of)
    fitted = {g: line(rows_of(g)) for g in gears}
    return {g: min(measured[g], fitted[g]) if g in unsettled and g in measured else measured.get(g, fitted[g])
            for g in gears}


def gear_line(gears: list, measured: dict, rows_of):
    """``rows -> seconds``: the line (fixed + per-row cost) fitted to the measured gears (`_line`)."""
    fixed, per_row = _line([(rows_of(g), t) for g, t in measured.items() if g in gears],
                           max((rows_of(g) for g in gears), default=1))
    return lambda rows: fixed + per_row * rows


def _line(points: list, largest: int) -> tuple[float, float]:
    """(fixed seconds per call, seconds per row) fitted to measured (rows, seconds) points: the median of the
    slopes between every two points and the median of what each point leaves for the fixed cost (Theil-Sen). A
    gear measured only while the machine was busy keeps a slow figure for long; a line through the two extremes,
    or least squares, let one such figure at either end price every unmeasured gear. Neither cost is negative
    (a negative fixed cost: a line through the origin instead). One point: a call's fixed cost taken as an eighth
    of its work; none: rows themselves, with an eighth of the largest gear's as the fixed cost."""
    slopes = [(t1 - t0) / (r1 - r0) for i, (r0, t0) in enumerate(points) for r1, t1 in points[i + 1:] if r1 != r0]
    if slopes:
        per_row = max(statistics.median(slopes), 0.0)
        fixed = statistics.median(t - per_row * r for r, t in points)
        if fixed < 0:
            fixed, per_row = 0.0, statistics.median(t / max(r, 1) for r, t in points)
        return fixed, per_row
    if points:
        r0 = max(r for r, _ in points)
        t0 = min(t for r, t in points if r == r0)
        return t0 / 9, (t0 - t0 / 9) / max(r0, 1)
    return largest / 8, 1.0


@dataclasses.dataclass(frozen=True)
class FitPlan:
    """How one size no gear serves runs: ``parts`` as (rows, gear), in order; a part with fewer rows than its
    gear is padded. One part: padded to that gear; several: split."""

    parts: tuple
    seconds: float  # predicted

    @property
    def split(self) -> bool:
        return len(self.parts) > 1


def plan_fit(n: int, sizes: list, seconds: dict) -> FitPlan | None:
    """The cheapest way to run ``n`` rows with gears of ``sizes`` rows each (``seconds``: size -> predicted time):
    a dynamic programme over the rows left, each step one gear's run (padded when it has more rows than are
    left). None when there are no sizes."""
    sizes = sorted(set(sizes))
    if not sizes or n < 1:
        return None
    best = [(0.0, ())] + [None] * n  # rows -> (seconds, parts) for the first rows
    for m in range(1, n + 1):
        options = []
        for g in sizes:
            if g >= m:
                options.append((seconds[g], ((m, g),)))
                break  # larger gears only cost more for these rows (latency grows with size)
            t, parts = best[m - g]
            options.append((t + seconds[g], parts + ((g, g),)))
        best[m] = min(options, key=lambda o: (o[0], len(o[1])))
    t, parts = best[n]
    # the same gears, filled largest first: the padding lands in the last, smallest part
    out, left = [], n
    for g in sorted((g for _, g in parts), reverse=True):
        out.append((min(g, left), g))
        left -= out[-1][0]
    return FitPlan(tuple(out), t)


class Splitter:
    """Runs a call of ``key`` as parts along one gear axis (the key positions ``axis``), each part a gear's
    graph on a slice of the inputs, and joins the outputs' rows. ``elsewhere``: the gear's sizes at the other key
    positions where they are larger than the call's (padded up in every part)."""

    def __init__(self, padder, axis: list, key: tuple, parts: tuple, table: dict, elsewhere: dict | None = None):
        self.padder = padder
        pos = axis[0]
        plan = padder.plans[pos]
        self.inputs = plan.inputs  # (input index, dim) holding the axis's rows
        self.scalars = plan.scalars
        real = {s.symbol: v for s, v in zip(padder.symbols, key)}
        self.joins = []  # (output index, dim) whose rows are joined; the others are taken from the first part
        self.fixed = {}
        for j, (states, meta) in enumerate(zip(padder.output_states, padder.output_metas)):
            if isinstance(meta, SymMeta):
                self.fixed[j] = size_output(meta, real)
            elif isinstance(states.get(pos), Row):
                self.joins.append((j, states[pos].dim))
        self.runs = []  # (offset, rows, callable)
        offset = 0
        for rows, gear in parts:
            part_key = tuple(rows if p in axis else v for p, v in enumerate(key))
            gear_key = tuple(gear if p in axis else (elsewhere or {}).get(p, v) for p, v in enumerate(key))
            fn = table[gear_key] if part_key == gear_key else padder.make(part_key, gear_key, table[gear_key])
            self.runs.append((offset, rows, fn))
            offset += rows

    def __call__(self, *args):
        results = []
        for offset, rows, fn in self.runs:
            part = list(args)
            for i, d in self.inputs:
                # contiguous, as a padded input (torch.cat) is: a gear's code may view its input as it was traced
                part[i] = args[i].narrow(d, offset, rows).contiguous()
            for i in self.scalars:
                part[i] = rows
            results.append(fn(*part))
        outs = list(results[0])
        for j, d in self.joins:
            outs[j] = torch.cat([r[j] for r in results], dim=d)
        for j, v in self.fixed.items():
            outs[j] = v
        return tuple(outs)
