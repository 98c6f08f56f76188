"""Which gears to compile: the set of sizes that serves the observed traffic with the least padded work.

Serving frameworks capture fixed ladders (powers of two, or 1, 2, 4, 8, 16, 24, 32, ...) whatever the
traffic; a batch of 9 padded to 16 runs 16 rows. `plan_gears` picks the gears from the traffic instead:
given how often each size occurs (a list of sizes, a ``{size: count}`` histogram, or a `Recording` of a
compiled function's calls) it returns the gears that minimise the expected time of a request when every
size is served by the smallest gear at or above it, within budgets on the number of gears, their memory
and their compile time.

The cost of a gear is its latency: by default proportional to its size (padded rows are work), or the
latency measured per candidate size (``latency=`` a ``{size: seconds}`` mapping, e.g. from
`measure_latency`, or a callable). The optimum is exact: a dynamic programme over the sorted candidate
sizes (``O(max_gears * candidates**2)``); with per-gear memory or compile budgets it keeps, per
candidate, every plan not beaten in cost, gears, memory and compile time at once (a Pareto front).
"""
from __future__ import annotations

import bisect
import collections.abc
import dataclasses
import math
import numbers
import operator
import statistics
import time
from typing import Callable

from .spec import MAX_GEAR_SIZE, MAX_GEARS, GearError

__all__ = ["plan_gears", "evaluate_gears", "measure_latency", "power_of_two_ladder", "GearPlan"]

DEFAULT_MAX_GEARS = 8  # TorchAir's guide: more than about 10 gears degrade performance
MAX_CANDIDATES = 20_000  # distinct candidate sizes; the exact programme is quadratic in them
_MAX_LABELS = 2_000_000  # Pareto labels in the budgeted programme before it gives up (says so)
_REL_TIE = 1e-12  # costs this close are equal: fewer gears win


@dataclasses.dataclass(frozen=True)
class GearShare:
    """What one gear of a plan serves."""

    gear: int
    sizes: tuple  # the observed sizes it serves (each padded up to ``gear``)
    requests: float  # share of requests it serves, in [0, 1]
    time: float  # share of the expected serving time it takes, in [0, 1]
    waste: float  # share of its own time spent on padding, in [0, 1]


@dataclasses.dataclass(frozen=True)
class GearPlan:
    """Gears for one dimension and what they are predicted to cost on the traffic they were planned for.

    ``expected_waste`` is the padded share of the predicted work: sum over requests of (latency of the
    gear that serves it - latency of its own size), divided by the sum of the gears' latencies (with
    the default model, padded rows / rows run). ``padded_rows`` is the same share counted in rows,
    whatever the latency model. ``ladder_*`` are the same figures for the power-of-two ladder that
    covers the traffic (`power_of_two_ladder`), the usual fixed choice.
    """

    gears: list
    expected_waste: float
    padded_rows: float
    cost_per_request: float  # expected latency of one request (seconds when measured, rows by default)
    shares: tuple  # of GearShare, one per gear
    requests: float  # total count of the traffic planned for
    distinct_sizes: int
    largest_size: int
    latency_model: str  # "proportional to size", "measured at N sizes", "callable"
    ladder: list
    ladder_waste: float
    ladder_padded_rows: float
    ladder_cost_per_request: float
    max_gears: int
    memory_bytes: float | None = None  # the plan's total per ``memory=`` (None when not given)
    compile_s: float | None = None  # the plan's total per ``compile_s=`` (None when not given)
    budgets: str = ""  # the budgets that bound the plan, in words
    stream: str = ""  # the recording stream planned for, if any

    @property
    def speedup_vs_ladder(self) -> float:
        """Predicted throughput of the plan / that of the power-of-two ladder (> 1: the plan is faster)."""
        return self.ladder_cost_per_request / self.cost_per_request if self.cost_per_request else 1.0

    def gear_for(self, size: int) -> int | None:
        """The gear that serves ``size`` (the smallest gear >= it), or None when it is larger than every gear."""
        k = bisect.bisect_left(self.gears, size)
        return self.gears[k] if k < len(self.gears) else None

    def apply(self, tensor, dim: int = 0):
        """Declare the plan's gears on ``tensor``'s dimension ``dim`` (`set_dim_gears`); returns ``tensor``.

        Serve sizes between gears with ``config.inference_config.gear_fallback = "pad"``."""
        from .spec import set_dim_gears

        set_dim_gears(tensor, {dim: list(self.gears)})
        return tensor

    def describe(self) -> str:
        head = (f"gear plan{' for ' + self.stream if self.stream else ''}: gears {self.gears} "
                f"({len(self.gears)} of at most {self.max_gears}{'; ' + self.budgets if self.budgets else ''})")
        lines = [head,
                 f"  traffic: {_num(self.requests)} {'requests' if float(self.requests).is_integer() else 'in weights'}, "
                 f"{self.distinct_sizes} distinct sizes up to "
                 f"{self.largest_size}; cost model: latency {self.latency_model}",
                 f"  expected waste {self.expected_waste:.1%} of the work (padded rows {self.padded_rows:.1%})",
                 f"  power-of-two ladder {self.ladder} ({len(self.ladder)} gears): waste {self.ladder_waste:.1%} (padded rows "
                 f"{self.ladder_padded_rows:.1%}); the plan is predicted {self.speedup_vs_ladder:.2f}x its throughput"]
        if self.memory_bytes is not None:
            lines.append(f"  memory: {_num(self.memory_bytes)} bytes in all")
        if self.compile_s is not None:
            lines.append(f"  compile: {self.compile_s:.3g} s in all")
        lines.append("  gear   requests   time    waste   serves sizes")
        for s in self.shares:
            lines.append(f"  {s.gear:>5}   {s.requests:>7.1%}  {s.time:>6.1%}  {s.waste:>6.1%}   {_ranges(s.sizes)}")
        return "\n".join(lines)

    __str__ = describe


def power_of_two_ladder(largest: int) -> list[int]:
    """1, 2, 4, ... up to the first power of two >= ``largest``: the fixed ladder serving frameworks capture."""
    out, g = [], 1
    while True:
        out.append(g)
        if g >= largest:
            return out
        g *= 2


# -- the planner ----------------------------------------------------------------------------------------------

def plan_gears(sizes, *, max_gears: int = DEFAULT_MAX_GEARS, latency=None, memory=None, max_memory_bytes=None,
               compile_s=None, max_compile_s=None, max_waste=None, candidates=None, stream=None,
               monotone: bool = True) -> GearPlan:
    """The gears that minimise the expected latency of the observed traffic, within the budgets.

    ``sizes``: the observed sizes of one dimension: a list (or any iterable) of positive ints, a
    ``{size: count}`` mapping (counts may be weights, e.g. probabilities), or a `Recording`
    (`rewrite.gears.recording`); a recording with several recorded dims needs ``stream=`` (a part of
    the stream's name, e.g. ``"x dim 0"``) unless only one of them took more than one size.

    A size is served by the smallest gear at or above it (``gear_fallback="pad"``); the largest observed
    size is always covered. The plan minimises ``sum(count(s) * latency(gear(s)))`` exactly over every set
    of at most ``max_gears`` gears drawn from ``candidates`` (default: the observed sizes and the sizes
    ``latency`` was measured at), subject to:

    * ``max_gears``: an int in [1, 100] (default 8);
    * ``latency``: None (latency proportional to size: padded rows are the cost), a ``{size: seconds}``
      mapping of measured gear latencies (linear between measured sizes, flat below the smallest;
      it must reach the largest observed size), or a callable ``size -> seconds``. With ``monotone``
      (the default) measured points are first fitted by the closest non-decreasing sequence (isotonic
      least squares): timing noise that makes 3 rows look faster than 2 must not pick the gears;
      ``monotone=False`` keeps them as measured (a kernel aligned at 64 rows may truly beat 60);
    * ``max_memory_bytes`` with ``memory=`` the bytes one gear holds (callable, mapping, or a constant):
      the gears' sum stays within it;
    * ``max_compile_s`` with ``compile_s=`` one gear's compile seconds (callable, mapping, or a constant);
    * ``max_waste``: a share in [0, 1]: the fewest gears whose expected waste is at most that (else the
      cheapest plan, which says the target was not reached).

    Among plans of equal cost the one with fewer gears wins. Raises `GearError` naming the argument
    when an argument is not allowed or no plan fits the budgets.
    """
    stream_name, hist = _traffic(sizes, stream)
    k_max = _int_in("max_gears", max_gears, 1, MAX_GEARS)
    observed = sorted(hist)
    largest = observed[-1]
    lat, model, measured_at = _latency(latency, largest, _flag("monotone", monotone))
    cands = _candidates(candidates, observed, measured_at)
    mem = _per_gear("memory", memory, "bytes")
    comp = _per_gear("compile_s", compile_s, "seconds")
    mem_cap = _budget("max_memory_bytes", max_memory_bytes, "memory", mem)
    comp_cap = _budget("max_compile_s", max_compile_s, "compile_s", comp)
    waste_cap = None
    if max_waste is not None:
        if isinstance(max_waste, bool) or not isinstance(max_waste, numbers.Real) or not 0 <= max_waste <= 1:
            raise GearError(f"plan_gears: max_waste must be a share in [0, 1] (0.1 for 10%), got {max_waste!r}")
        waste_cap = float(max_waste)

    lat_c = [lat(c) for c in cands]
    mem_c = [_non_negative("memory", mem(c), c) for c in cands] if mem is not None else None
    comp_c = [_non_negative("compile_s", comp(c), c) for c in cands] if comp is not None else None
    # W[j]: traffic served by a gear at cands[j] when the next smaller gear is below every size (prefix counts).
    weight = _prefix_counts(hist, cands)
    budgets = []
    if mem_cap is not None:
        budgets.append(f"memory <= {_num(mem_cap)} bytes")
    if comp_cap is not None:
        budgets.append(f"compile <= {comp_cap:.3g} s")

    k_eff = k_max
    constant_budgets = True
    for name, cap, per in (("max_memory_bytes", mem_cap, mem_c), ("max_compile_s", comp_cap, comp_c)):
        if cap is None:
            continue
        if len(set(per)) == 1:  # a constant per gear: the budget is a number of gears
            if per[0] > 0 and math.isfinite(cap):
                k_eff = min(k_eff, int(cap // per[0]))
        else:
            constant_budgets = False
    if k_eff < 1:
        raise GearError(_no_fit(cands, largest, mem_cap, mem_c, comp_cap, comp_c))
    if constant_budgets:
        per_k = _optimum(lat_c, weight, k_eff, cands, largest)
    else:
        per_k = _optimum_budgeted(lat_c, weight, k_eff, cands, largest, mem_cap, mem_c, comp_cap, comp_c)
    if not per_k:
        raise GearError(_no_fit(cands, largest, mem_cap, mem_c, comp_cap, comp_c))
    # The cheapest plan; of plans within a relative 1e-12 of its cost, the one with the fewest gears.
    best = min(c for c, _ in per_k.values())
    k_best = min(k for k, (c, _) in per_k.items() if c <= best + _REL_TIE * abs(best))
    chosen = per_k[k_best][1]
    if waste_cap is not None:
        reached = False
        for k, (_, idx) in sorted(per_k.items()):
            if k <= k_best and _serve(hist, [cands[j] for j in idx], lat)["waste"] <= waste_cap:
                chosen, reached = idx, True  # the fewest gears that waste at most max_waste
                break
        budgets.insert(0, f"max_waste {waste_cap:.1%}" + ("" if reached else " NOT reached"))
    gears = [cands[j] for j in chosen]
    return _plan(hist, gears, lat, model, k_max,
                 memory_bytes=sum(mem_c[j] for j in chosen) if mem_c is not None else None,
                 compile_total=sum(comp_c[j] for j in chosen) if comp_c is not None else None,
                 budgets="; ".join(budgets), stream=stream_name)


def evaluate_gears(sizes, gears, *, latency=None, stream=None, monotone: bool = True) -> GearPlan:
    """The figures of a given set of gears on the traffic ``sizes`` (same arguments as `plan_gears`):
    e.g. a ladder you deploy today. The largest gear must cover the largest observed size."""
    stream_name, hist = _traffic(sizes, stream)
    if isinstance(gears, (str, bytes)) or not isinstance(gears, collections.abc.Iterable):
        raise GearError(f"evaluate_gears: gears must be a list of positive ints, got {gears!r}")
    gs = sorted({_size("gears", g) for g in gears})
    if not gs:
        raise GearError("evaluate_gears: gears must be a non-empty list of positive ints")
    largest = max(hist)
    if gs[-1] < largest:
        raise GearError(f"evaluate_gears: gears {gs} do not cover the largest observed size {largest}; "
                        f"the largest gear must be >= {largest}")
    lat, model, _ = _latency(latency, largest, _flag("monotone", monotone))
    return _plan(hist, gs, lat, model, len(gs), stream=stream_name)


def _plan(hist: dict, gears: list, lat, model: str, k_max: int, *, memory_bytes=None, compile_total=None,
          budgets: str = "", stream: str = "") -> GearPlan:
    served = _serve(hist, gears, lat)
    total = sum(hist.values())
    ladder = power_of_two_ladder(max(hist))
    ladder_served = _serve(hist, ladder, lat)
    shares = []
    for g in gears:
        sizes = tuple(s for s in sorted(hist) if _gear_of(gears, s) == g)
        req = sum(hist[s] for s in sizes)
        run = req * lat(g)
        pad = sum(hist[s] * max(0.0, lat(g) - lat(s)) for s in sizes)
        shares.append(GearShare(g, sizes, req / total if total else 0.0, run / served["time"] if served["time"] else 0.0,
                                pad / run if run else 0.0))
    return GearPlan(list(gears), served["waste"], served["rows"], served["time"] / total if total else 0.0,
                    tuple(shares), total, len(hist), max(hist), model, ladder, ladder_served["waste"],
                    ladder_served["rows"], ladder_served["time"] / total if total else 0.0, k_max,
                    memory_bytes, compile_total, budgets, stream)


def _serve(hist: dict, gears: list, lat) -> dict:
    """Time, padded-time share and padded-row share of serving ``hist`` with ``gears``."""
    run = pad = rows = padded_rows = 0.0
    for s, c in hist.items():
        g = _gear_of(gears, s)
        run += c * lat(g)
        pad += c * max(0.0, lat(g) - lat(s))
        rows += c * g
        padded_rows += c * (g - s)
    return {"time": run, "waste": _share(pad, run), "rows": _share(padded_rows, rows)}


def _share(part: float, whole: float) -> float:
    return min(1.0, max(0.0, part / whole)) if whole > 0 else 0.0


def _gear_of(gears: list, size: int) -> int:
    return gears[bisect.bisect_left(gears, size)]


def _prefix_counts(hist: dict, cands: list) -> list:
    sizes = sorted(hist)
    out, acc, i = [], 0.0, 0
    for c in cands:
        while i < len(sizes) and sizes[i] <= c:
            acc += hist[sizes[i]]
            i += 1
        out.append(acc)
    return out


def _optimum(lat: list, weight: list, k_max: int, cands: list, largest: int) -> dict:
    """{k: (cost, indices into ``cands``)}: per number of gears k <= ``k_max``, the cheapest k gears whose
    largest is >= ``largest``.

    cost[k][j]: the least time to serve every size <= cands[j] with k gears, the largest at cands[j]:
    cost[1][j] = lat[j] * W[j]; cost[k][j] = min over i < j of cost[k-1][i] + lat[j] * (W[j] - W[i])."""
    import numpy as np

    m = len(cands)
    lat_a, w = np.asarray(lat, dtype=np.float64), np.asarray(weight, dtype=np.float64)
    ends = [j for j in range(m) if cands[j] >= largest]
    cost = lat_a * w
    back: list = [None, None]  # back[k][j]: the previous gear of the best k-gear plan ending at j
    out = {}
    for k in range(1, min(k_max, m) + 1):
        if k > 1:
            new = np.full(m, np.inf)
            arg = np.full(m, -1, dtype=np.int64)
            for j in range(k - 1, m):
                vals = cost[:j] - lat_a[j] * w[:j]
                i = int(np.argmin(vals))
                new[j] = vals[i] + lat_a[j] * w[j]
                arg[j] = i
            back.append(arg)
            cost = new
        j = min(ends, key=lambda j: cost[j])
        if not np.isfinite(cost[j]):
            break
        chosen, jj = [], j
        for kk in range(k, 0, -1):
            chosen.append(jj)
            if kk > 1:
                jj = int(back[kk][jj])
        out[k] = (float(cost[j]), sorted(chosen))
    return out


def _optimum_budgeted(lat, weight, k_max, cands, largest, mem_cap, mem, comp_cap, comp) -> dict:
    """`_optimum` with additive memory and compile budgets: per candidate, the Pareto front of
    (gears, cost, memory, compile seconds) over plans whose largest gear is that candidate."""
    m = len(cands)
    zero = [0.0] * m
    mem = mem if mem is not None else zero
    comp = comp if comp is not None else zero
    mem_cap = math.inf if mem_cap is None else mem_cap
    comp_cap = math.inf if comp_cap is None else comp_cap
    fronts: list = []  # per j: list of labels (k, cost, mem, comp, previous label or None, j)
    count = 0
    for j in range(m):
        labels = []
        if mem[j] <= mem_cap and comp[j] <= comp_cap:
            labels.append((1, lat[j] * weight[j], mem[j], comp[j], None, j))
        for i in range(j):
            for lab in fronts[i]:
                k, c, mm, cc = lab[0] + 1, lab[1] + lat[j] * (weight[j] - weight[i]), lab[2] + mem[j], lab[3] + comp[j]
                if k <= k_max and mm <= mem_cap and cc <= comp_cap:
                    labels.append((k, c, mm, cc, lab, j))
        front = _pareto(labels)
        count += len(front)
        if count > _MAX_LABELS:
            raise GearError(f"plan_gears: the memory/compile budgets over {m} candidate sizes keep more than "
                            f"{_MAX_LABELS} partial plans; pass fewer candidates= (e.g. multiples of 8) or a "
                            "constant memory=/compile_s= per gear")
        fronts.append(front)
    out: dict = {}
    for j in range(m):
        if cands[j] < largest:
            continue
        for lab in fronts[j]:
            if lab[0] not in out or (lab[1], lab[2], lab[3]) < out[lab[0]][0]:
                out[lab[0]] = ((lab[1], lab[2], lab[3]), lab)
    result = {}
    for k, (_, lab) in sorted(out.items()):
        cost, chosen = lab[1], []
        while lab is not None:
            chosen.append(lab[5])
            lab = lab[4]
        result[k] = (cost, sorted(chosen))
    return result


def _pareto(labels: list) -> list:
    """The labels no other label beats or equals in all of (gears, cost, memory, compile)."""
    labels.sort(key=lambda l: (l[1], l[0], l[2], l[3]))
    out: list = []
    for lab in labels:
        if not any(o[0] <= lab[0] and o[1] <= lab[1] and o[2] <= lab[2] and o[3] <= lab[3] for o in out):
            out.append(lab)
    return out


def _no_fit(cands, largest, mem_cap, mem, comp_cap, comp) -> str:
    covering = [j for j in range(len(cands)) if cands[j] >= largest]
    parts = []
    if mem_cap is not None:
        j = min(covering, key=lambda j: mem[j])
        parts.append(f"max_memory_bytes={_num(mem_cap)} (the smallest gear covering it, {cands[j]}, needs "
                     f"{_num(mem[j])} bytes)")
    if comp_cap is not None:
        j = min(covering, key=lambda j: comp[j])
        parts.append(f"max_compile_s={comp_cap:g} (the cheapest gear covering it, {cands[j]}, takes {comp[j]:g} s)")
    return (f"plan_gears: no set of gears covering the largest observed size {largest} fits the budgets: "
            + " and ".join(parts) + "; raise the budget")


# -- argument checks --------------------------------------------------------------------------------------------

def _size(name: str, v) -> int:
    try:
        iv = operator.index(v)  # ints, numpy integers, 0-d integer tensors
    except TypeError:
        iv = None
    if isinstance(v, bool) or iv is None or iv <= 0 or iv > MAX_GEAR_SIZE:
        raise GearError(f"plan_gears: {name} must hold positive ints (tensor sizes), got {v!r}")
    return iv


def _traffic(sizes, stream) -> tuple[str, dict]:
    """(the recorded stream's name or "", ``{size: count}``) of the ``sizes`` argument."""
    from .traffic import Recording

    if isinstance(sizes, Recording):
        name, sizes = sizes.select(stream)
        return name, _histogram(sizes)
    if stream is not None:
        raise GearError("plan_gears: stream= selects a recorded dim and needs a Recording as sizes; "
                        f"got sizes of type {type(sizes).__name__}")
    return "", _histogram(sizes)


def _histogram(sizes) -> dict:
    """``{size: count}`` from a list of sizes or a mapping; zero counts dropped; empty traffic is an error."""
    if isinstance(sizes, collections.abc.Mapping):
        hist: dict = {}
        for s, c in sizes.items():
            s = _size("sizes", s)
            if isinstance(c, bool) or not isinstance(c, numbers.Real) or not math.isfinite(c) or c < 0:
                raise GearError(f"plan_gears: sizes maps size {s} to count {c!r}; counts must be finite numbers >= 0")
            if c > 0:
                hist[s] = hist.get(s, 0) + c
    elif isinstance(sizes, (str, bytes)) or not isinstance(sizes, collections.abc.Iterable):
        raise GearError("plan_gears: sizes must be a list of sizes, a {size: count} mapping or a Recording "
                        f"(rewrite.gears.recording), got {type(sizes).__name__}")
    else:
        hist = {}
        for s in sizes:
            s = _size("sizes", s)
            hist[s] = hist.get(s, 0) + 1
    if not hist:
        raise GearError("plan_gears: sizes is empty (no traffic, or every count is 0): there is nothing to plan for")
    return hist


def _int_in(name: str, v, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not lo <= v <= hi:
        raise GearError(f"plan_gears: {name} must be an int in [{lo}, {hi}], got {v!r}")
    return int(v)


def _positive(name: str, v, size: int) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v <= 0:
        raise GearError(f"plan_gears: {name} at size {size} is {v!r}; it must be a finite number > 0")
    return float(v)


def _non_negative(name: str, v, size: int) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
        raise GearError(f"plan_gears: {name} at size {size} is {v!r}; it must be a finite number >= 0")
    return float(v)


def _flag(name: str, v) -> bool:
    if not isinstance(v, bool):
        raise GearError(f"plan_gears: {name} must be True or False, got {v!r}")
    return v


def _latency(latency, largest: int, monotone: bool = True):
    """(size -> latency, the model in words, the sizes it was measured at)."""
    if latency is None:
        return float, "proportional to size", []
    if isinstance(latency, collections.abc.Mapping):
        table = _table("latency", latency, positive=True)
        if max(table) < largest:
            raise GearError(f"plan_gears: latency was measured up to size {max(table)}, but the traffic reaches "
                            f"{largest}; measure it up to at least {largest}")
        if monotone:
            fitted = _isotonic(table)
            changed = sum(1 for s in table if fitted[s] != table[s])
            return (_interpolated(fitted), f"measured at {len(table)} sizes"
                    + (f" (made non-decreasing: {changed} adjusted)" if changed else ""), sorted(table))
        return _interpolated(table), f"measured at {len(table)} sizes", sorted(table)
    if callable(latency):
        return _checked("latency", latency, positive=True), "callable", []
    raise GearError(f"plan_gears: latency must be None, a {{size: seconds}} mapping or a callable size -> seconds, "
                    f"got {type(latency).__name__}")


def _table(name: str, mapping, positive: bool) -> dict:
    if not mapping:
        raise GearError(f"plan_gears: {name} is an empty mapping; give {{size: value}} for at least one size")
    out = {}
    for s, v in mapping.items():
        s = _size(name, s)
        out[s] = _positive(name, v, s) if positive else _non_negative(name, v, s)
    return out


def _checked(name: str, fn, positive: bool):
    """``fn`` (a user's size -> number), each answer checked once and remembered."""
    memo: dict = {}

    def f(s):
        v = memo.get(s)
        if v is None:
            try:
                raw = fn(s)
            except GearError:
                raise
            except Exception as e:  # noqa: BLE001 - the user's callable: say which argument failed, and where
                raise GearError(f"plan_gears: {name}({s}) raised {type(e).__name__}: {e}") from e
            v = memo[s] = _positive(name, raw, s) if positive else _non_negative(name, raw, s)
        return v

    return f


def _isotonic(table: dict) -> dict:
    """The non-decreasing values closest to ``table``'s (least squares; pool adjacent violators)."""
    xs = sorted(table)
    blocks: list = []  # [sum, count, number of points]
    for x in xs:
        blocks.append([table[x], 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    out, i = {}, 0
    for s, c in blocks:
        for _ in range(c):
            out[xs[i]] = table[xs[i]] if c == 1 else s / c
            i += 1
    return out


def _interpolated(table: dict) -> Callable[[int], float]:
    """Linear between the measured sizes (monotone on each segment), flat below the smallest, and beyond the
    largest proportional to size."""
    xs = sorted(table)
    ys = [table[x] for x in xs]

    def f(s):
        if s in table:
            return table[s]
        k = bisect.bisect_left(xs, s)
        if k == 0:
            return ys[0]
        if k == len(xs):
            return ys[-1] * s / xs[-1]
        x0, x1, y0, y1 = xs[k - 1], xs[k], ys[k - 1], ys[k]
        return y0 + (y1 - y0) * (s - x0) / (x1 - x0)

    return f


def _per_gear(name: str, value, unit: str):
    """A per-gear quantity as a function of the gear's size (None when not given)."""
    if value is None:
        return None
    if isinstance(value, collections.abc.Mapping):
        return _interpolated(_table(name, value, positive=False))
    if callable(value):
        return _checked(name, value, positive=False)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if not math.isfinite(value) or value < 0:
            raise GearError(f"plan_gears: {name} must be a finite number >= 0 per gear, got {value!r}")
        v = float(value)
        return lambda s: v
    raise GearError(f"plan_gears: {name} must be {unit} per gear: a number, a {{size: {unit}}} mapping or a callable "
                    f"size -> {unit}, got {type(value).__name__}")


def _budget(name: str, cap, per_name: str, per):
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, numbers.Real) or not (cap >= 0) or math.isnan(cap):
        raise GearError(f"plan_gears: {name} must be a number >= 0, got {cap!r}")
    if per is None:
        raise GearError(f"plan_gears: {name} needs {per_name}= (what one gear costs: a number, a mapping or a callable)")
    return float(cap)


def _candidates(candidates, observed: list, measured_at: list) -> list:
    if candidates is None:
        # measured sizes up to the ladder's top: a measured gear above the largest size may be faster than it
        top = power_of_two_ladder(observed[-1])[-1]
        cands = set(observed) | {s for s in measured_at if s <= top}
    else:
        if isinstance(candidates, (str, bytes)) or not isinstance(candidates, collections.abc.Iterable):
            raise GearError(f"plan_gears: candidates must be a list of positive ints, got {candidates!r}")
        cands = {_size("candidates", c) for c in candidates}
        if not cands or max(cands) < observed[-1]:
            raise GearError(f"plan_gears: candidates {sorted(cands)[:10]}{'...' if len(cands) > 10 else ''} has no size "
                            f">= the largest observed size {observed[-1]}; add one")
    smallest = observed[0]
    out = sorted(c for c in cands if c >= smallest)  # a gear below every size serves nothing
    if len(out) > MAX_CANDIDATES:
        raise GearError(f"plan_gears: {len(out)} candidate sizes; at most {MAX_CANDIDATES} are planned over exactly: "
                        "pass candidates= (e.g. range(8, largest + 8, 8))")
    return out


# -- measuring latency -----------------------------------------------------------------------------------------

def measure_latency(fn, make_input, sizes, *, repeat: int = 5, warmup: int = 1) -> dict:
    """``{size: median seconds of fn at that size}``: the measured gear latencies `plan_gears` takes.

    ``make_input(size)`` returns the argument of ``fn`` at that size (a tuple is passed as several
    arguments); ``fn`` runs ``warmup`` times, then ``repeat`` timed times per size (the median is kept,
    robust to a busy machine). Measure what will serve the gears (the compiled model, or eager as a
    proxy of its shape); a CUDA ``fn`` is synchronized around each call.
    """
    if not callable(fn) or not callable(make_input):
        raise GearError("measure_latency: fn and make_input must be callables (make_input(size) -> fn's argument)")
    repeat = _int_in("repeat", repeat, 1, 10_000)
    warmup = _int_in("warmup", warmup, 0, 10_000)
    if isinstance(sizes, collections.abc.Mapping):
        sizes = list(sizes)
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, collections.abc.Iterable):
        raise GearError(f"measure_latency: sizes must be a list of positive ints, got {sizes!r}")
    todo = sorted({_size("sizes", s) for s in sizes})
    if not todo:
        raise GearError("measure_latency: sizes is empty")
    sync = _synchronizer()
    out = {}
    for s in todo:
        args = make_input(s)
        args = args if isinstance(args, tuple) else (args,)
        for _ in range(warmup):
            fn(*args)
        samples = []
        for _ in range(repeat):
            sync()
            t0 = time.perf_counter()
            fn(*args)
            sync()
            samples.append(time.perf_counter() - t0)
        out[s] = max(statistics.median(samples), 1e-12)
    return out


def _synchronizer():
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda.synchronize
    except Exception:  # noqa: BLE001 - no torch, or no CUDA: nothing to wait for
        pass
    return lambda: None


# -- printing ---------------------------------------------------------------------------------------------------

def _num(v) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:,.3g}"


def _ranges(sizes) -> str:
    """1-4, 7, 9-12 style."""
    parts, start, prev = [], None, None
    for s in sorted(sizes):
        if start is None:
            start = prev = s
        elif s == prev + 1:
            prev = s
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = s
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(parts)
