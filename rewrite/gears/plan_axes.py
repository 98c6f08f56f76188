"""Gears for two axes at once: the batch sizes and the sequence lengths that serve a recorded traffic of
``(batch, sequence)`` requests best, within a budget on the number of gears: a grid (`plan_gear_axes`,
``|B| x |L|`` graphs, the "product" policy) or any pairs (`plan_gear_pairs`, the "zip" policy).

`plan_gears` plans one dim. Planning batch and sequence apart ignores that every (batch, sequence) pair is a
graph: 4 batch gears and 4 sequence gears are 16 graphs, and a request's cost is its padded batch times its
padded length, so the best lengths depend on the batches they are padded with. `plan_gear_axes` splits the
budget every way (``|B| * |L| <= max_gears``) and, for each split, alternates the exact one-dim programme:
the batch gears that serve the traffic best given the sequence gears, then the sequence gears given those,
until neither changes (a few rounds). Each request is served by the smallest gear at or above it on each axis
(``gear_fallback="pad"``). The cost of a gear pair is its latency: by default proportional to ``batch *
sequence`` (padded positions are work), or a callable ``latency(batch, sequence) -> seconds`` (measured at a
few gears and interpolated, say).
"""
from __future__ import annotations

import collections
import dataclasses
import math
from typing import Callable

from .spec import MAX_GEARS, GearError

__all__ = ["plan_gear_axes", "AxesPlan", "plan_gear_pairs", "PairsPlan"]

_ROUNDS = 6  # alternations of the two one-dim programmes per budget split (they settle in two or three)


class _PredictedWaste:
    """What a two-axis plan reports from its ``cost`` and ``real``."""

    @property
    def expected_waste(self) -> float:
        """The padded share of the predicted cost (0 when nothing is padded)."""
        return max(0.0, 1 - self.real / self.cost) if self.cost else 0.0


@dataclasses.dataclass(frozen=True)
class AxesPlan(_PredictedWaste):
    """Batch gears x sequence gears, and what they cost on the traffic they were planned for."""

    batch: list
    sequence: list
    cost: float  # the traffic's predicted cost (latency units), every request padded to its gear pair
    real: float  # the same traffic without padding, in the same units
    requests: int

    @property
    def gears(self) -> int:
        return len(self.batch) * len(self.sequence)

    def __str__(self) -> str:
        return (f"{self.gears} gears: batch {self.batch} x sequence {self.sequence}; "
                f"{self.expected_waste:.1%} of the predicted work is padding ({self.requests} requests)")


def plan_gear_axes(shapes, *, max_gears: int = 16, latency: Callable | None = None) -> AxesPlan:
    """The batch and sequence gears that serve ``shapes`` (a list of ``(batch, sequence)`` requests, or a
    ``{(batch, sequence): count}`` histogram) with the least predicted cost, at most ``max_gears`` pairs."""
    hist, latency = _arguments("plan_gear_axes", shapes, max_gears, latency)
    batches = sorted({b for b, _ in hist})
    lengths = sorted({s for _, s in hist})
    best = None
    for nb in range(1, min(max_gears, len(batches)) + 1):
        nl = min(max_gears // nb, len(lengths))
        seq = [lengths[-1]]
        bat = [batches[-1]]
        for _ in range(_ROUNDS):
            new_bat = _best_axis(hist, 0, batches, nb, seq, latency)
            new_seq = _best_axis(hist, 1, lengths, nl, new_bat, latency)
            if (new_bat, new_seq) == (bat, seq):
                break
            bat, seq = new_bat, new_seq
        cost = _cost(hist, bat, seq, latency)
        if best is None or cost < best[0] - 1e-12 * abs(best[0]) or \
                (abs(cost - best[0]) <= 1e-12 * abs(best[0]) and len(bat) * len(seq) < len(best[1]) * len(best[2])):
            best = (cost, bat, seq)
    cost, bat, seq = best
    real = sum(n * latency(b, s) for (b, s), n in hist.items())
    return AxesPlan(bat, seq, cost, real, sum(hist.values()))


@dataclasses.dataclass(frozen=True)
class PairsPlan(_PredictedWaste):
    """Gears as (batch, sequence) pairs, not a grid: declare them with ``dynamic_gears_merge_policy="zip"`` and
    ``set_dim_gears(t, plan.dim_gears)`` on each input that carries both dims."""

    pairs: list  # [(batch, sequence), ...], sorted
    cost: float
    real: float
    requests: int

    @property
    def gears(self) -> int:
        return len(self.pairs)

    @property
    def dim_gears(self) -> dict:
        """``{0: batches, 1: sequences}``, position by position (the "zip" policy pairs them back)."""
        return {0: [b for b, _ in self.pairs], 1: [s for _, s in self.pairs]}

    def __str__(self) -> str:
        return (f"{self.gears} gear pairs {self.pairs}; {self.expected_waste:.1%} of the predicted work is padding "
                f"({self.requests} requests)")


def plan_gear_pairs(shapes, *, max_gears: int = 16, latency: Callable | None = None) -> PairsPlan:
    """At most ``max_gears`` (batch, sequence) gears, any pairs, that serve ``shapes`` with the least predicted cost.

    A grid (`plan_gear_axes`) gives every batch gear every sequence gear; on traffic where large batches are also
    long (a request padded to the longest of more sentences is longer) most of its pairs serve nothing, and its few
    small-and-short gears are far apart. Any pairs fit that diagonal: the gears start with the largest request's
    (batch, sequence) and grow greedily, each time by the pair (among every recorded batch size x every recorded
    length) that lowers the predicted cost most, every request served by the cheapest gear at or above it in both
    dims (what ``gear_fallback="pad"`` does). Greedy, so not always the optimum; the cost it predicts is exact."""
    import numpy as np

    hist, latency = _arguments("plan_gear_pairs", shapes, max_gears, latency)
    keys = list(hist)
    rb = np.array([b for b, _ in keys])
    rs = np.array([s for _, s in keys])
    count = np.array([hist[k] for k in keys], dtype=float)
    cands = [(b, s) for b in sorted(set(rb.tolist())) for s in sorted(set(rs.tolist()))]
    cb = np.array([b for b, _ in cands])[:, None]
    cs = np.array([s for _, s in cands])[:, None]
    cover = (cb >= rb[None, :]) & (cs >= rs[None, :])  # [candidate, request]: the candidate can serve it
    price = np.array([latency(b, s) for b, s in cands], dtype=float)
    top = (int(rb.max()), int(rs.max()))  # the one gear that serves every request
    chosen = [top]
    current = np.full(len(keys), float(latency(*top)))
    while len(chosen) < max_gears:
        # what each candidate saves: the requests it covers that it serves cheaper than their gear now
        gain = (np.clip(current[None, :] - price[:, None], 0, None) * cover * count[None, :]).sum(axis=1)
        best = int(gain.argmax())
        if gain[best] <= 0:
            break
        chosen.append(cands[best])
        current = np.where(cover[best], np.minimum(current, price[best]), current)
    real = sum(n * latency(b, s) for (b, s), n in hist.items())
    return PairsPlan(sorted(chosen), float((current * count).sum()), float(real), int(count.sum()))


def _best_axis(hist: dict, axis: int, cands: list, k: int, other: list, latency) -> list:
    """The at most ``k`` gears of ``axis`` (0 batch, 1 sequence) among ``cands`` that serve ``hist`` best when the
    other axis is served by the gears ``other``: the exact interval programme (the largest candidate is a gear)."""
    other_of = {v: _gear_of(other, v) for v in {key[1 - axis] for key in hist}}
    # per candidate: the requests whose size on this axis is that candidate, with their other-axis gear
    at: dict = collections.defaultdict(list)
    for key, n in hist.items():
        at[key[axis]].append((other_of[key[1 - axis]], n))

    def served(gear, lo, hi):  # requests with sizes in cands[lo:hi] served by ``gear`` on this axis
        total = 0.0
        for c in cands[lo:hi]:
            for o, n in at[c]:
                total += n * (latency(gear, o) if axis == 0 else latency(o, gear))
        return total

    m = len(cands)
    # dp[j][i]: least cost of the requests up to cands[i-1], with j gears, the last at cands[i-1]
    inf = math.inf
    dp = [[inf] * (m + 1) for _ in range(k + 1)]
    back = [[-1] * (m + 1) for _ in range(k + 1)]
    dp[0][0] = 0.0
    for j in range(1, k + 1):
        for i in range(1, m + 1):
            for p in range(i):
                if dp[j - 1][p] == inf:
                    continue
                c = dp[j - 1][p] + served(cands[i - 1], p, i)
                if c < dp[j][i]:
                    dp[j][i], back[j][i] = c, p
    j = min(range(1, k + 1), key=lambda j: (dp[j][m], j))
    gears, i = [], m
    while i > 0:
        gears.append(cands[i - 1])
        i, j = back[j][i], j - 1
    return sorted(gears)


def _cost(hist: dict, bat: list, seq: list, latency) -> float:
    return sum(n * latency(_gear_of(bat, b), _gear_of(seq, s)) for (b, s), n in hist.items())


def _gear_of(gears: list, size: int) -> int:
    return next(g for g in gears if g >= size)


def _arguments(planner: str, shapes, max_gears, latency) -> tuple[dict, Callable]:
    """A planner's checked arguments: the traffic as a histogram, and the latency (``b * s`` by default)."""
    hist = _histogram(shapes, planner)
    if not isinstance(max_gears, int) or isinstance(max_gears, bool) or not 1 <= max_gears <= MAX_GEARS:
        raise GearError(f"{planner}: max_gears must be an int in [1, {MAX_GEARS}], got {max_gears!r}")
    if latency is None:
        def latency(b, s):
            return b * s
    elif not callable(latency):
        raise GearError(f"{planner}: latency must be a callable (batch, sequence) -> seconds, got "
                        f"{type(latency).__name__}")
    return hist, latency


def _histogram(shapes, planner: str) -> dict:
    items = shapes.items() if isinstance(shapes, dict) else ((shape, 1) for shape in shapes)
    hist: dict = collections.Counter()
    for shape, n in items:
        if not (isinstance(shape, tuple) and len(shape) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in shape)):
            raise GearError(f"{planner}: a request is a (batch, sequence) pair of positive ints, got {shape!r}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise GearError(f"{planner}: the count of {shape} must be a non-negative int, got {n!r}")
        hist[shape] += n
    hist = {k: v for k, v in hist.items() if v}
    if not hist:
        raise GearError(f"{planner}: no requests to plan for")
    return hist
