"""Declaring gears on input tensors and merging them into the list of gears a graph is compiled for.

A *gear* is one allowed combination of sizes for the dynamic dimensions of a graph's inputs. The
user declares per tensor which values each dimension may take (`set_dim_gears`); the merge policy
(``config.inference_config.dynamic_gears_merge_policy``) says how lists combine, first the lists
of one tensor, then the tensors with each other:

* ``zip``: position by position (lists must have equal lengths);
* ``product``: every combination (Cartesian product).

At most `MAX_GEARS` distinct gears are allowed in total: each one is a separate static graph to
compile. A value repeated in a list is allowed and compiled once (gears are distinct combinations);
a value larger than the largest tensor size torch allows (`MAX_GEAR_SIZE`) is an error.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import operator
import threading
import weakref

import torch

from ..fx_bridge import argument_path, dynamo_input_names
from ..utils import connected_groups

log = logging.getLogger("rewrite")

__all__ = ["GearError", "OutsideDeclaredRange", "set_dim_gears", "get_dim_gears", "collect_gear_specs", "GearSpec", "InputGears",
           "MAX_GEARS", "gear_axes", "size_oblivious", "restore_size_oblivious", "retrace_at_own_sizes"]

MAX_GEARS = 100
MAX_GEAR_SIZE = 2**63 - 1  # torch sizes are int64

# The attribute set_dim_gears stores the declared gears in: {dim (non-negative): (values...)}.
_ATTR = "_rewrite_dim_gears"


class GearError(ValueError, AssertionError):
    """Gears were declared wrongly, or an input's shape is not one of the gears.

    Also an AssertionError, because TorchAir raises AssertionError for the same mistakes and
    ported scripts catch that."""


class OutsideDeclaredRange(GearError, IndexError):
    """A call whose size lies outside the range a ``shapes_spec`` ShapeVar declares for it.

    Dynamo traces such a call again with the ShapeVar's range as a guard, which the call itself fails (torch
    2.13: "AssertionError: Guard failed on the same frame it was created", with any backend); rewrite refuses
    the trace first, naming the ShapeVar, its range and the size. Also an IndexError (a size out of range):
    Dynamo passes a backend's IndexError to the caller as it is (torch 2.13-2.14), where it wraps any other
    exception in BackendCompilerFailed, which ``except GearError`` would miss."""


def set_dim_gears(tensor: torch.Tensor, dim_gears: dict) -> None:
    """Declare the sizes dimension ``dim`` of ``tensor`` may take: ``dim_gears={dim: [values...]}``.

    Checked at once: ``dim`` must be in range for the tensor (negative dims count from the end),
    values positive ints. A tensor that already has gears may only be given the same gears again
    (TorchAir's rule, from the seed: the same tensor may not be given different gears twice; a
    different value or an added dim is an error). The dims are marked dynamic for Dynamo, so one
    trace serves every gear.

    One trace for every gear, whatever size the first call has: Dynamo traces the dims with the
    largest gear as their size hint (``mark_dynamic(..., hint_override=)``), so the guards it records
    are those of the general case. A guard a smaller gear contradicts only because an op asked about
    the size (ATen's attention or convolution backend choice asking ``batch == 1``, a meta kernel's
    stride rule) is released for that gear when its own shapes agree with the trace
    (`rewrite.gears.compile.release_op_guards`); a guard from the model's own code (``if
    x.shape[0] > 3``) is kept, and Dynamo traces such sizes separately; when the call being compiled
    is such a size, its trace restarts at its own size (`retrace_at_own_sizes`).

    Size 1: Dynamo specializes sizes 0 and 1 of backed symbols, so a batch-1 call would trace a
    second graph (as a gear it would be compiled twice; outside the gears it would bypass the gear
    check). This turns on torch's ``torch.fx.experimental._config.backed_size_oblivious``, which
    gives dynamic sizes the range [0, oo) without the 0/1 specialization. Dynamo reads the flag
    while tracing, before any backend sees the graph, so it is set here and put back to its old
    value when the geared graph first runs (Dynamo also reads it when it builds the guards, after
    the backend returns). `mark_unbacked` would need no flag but fails on models that branch on
    a size (transformers' ``q_length > 1``), so it is not used.
    """
    if not isinstance(tensor, torch.Tensor):
        raise GearError(f"set_dim_gears: expected a torch.Tensor, got {type(tensor).__name__}")
    if not isinstance(dim_gears, dict) or not dim_gears:
        raise GearError(f"set_dim_gears: dim_gears must be a non-empty dict {{dim: [values...]}}, got {dim_gears!r}")
    rank = tensor.dim()
    normalized: dict[int, tuple[int, ...]] = {}
    for dim, values in dim_gears.items():
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise GearError(f"set_dim_gears: dim {dim!r} must be an int in [{-rank}, {rank - 1}]")
        if not -rank <= dim < rank:
            raise GearError(f"set_dim_gears: dim {dim} is out of range for a tensor of rank {rank} "
                            f"(shape {tuple(tensor.shape)}); allowed dims are {-rank}..{rank - 1}")
        d = dim % rank
        if d in normalized:
            raise GearError(f"set_dim_gears: dim {dim} and dim {d - rank if dim >= 0 else d} name the same "
                            f"dimension of a rank-{rank} tensor; give it once")
        if not isinstance(values, (list, tuple)) or not values:
            raise GearError(f"set_dim_gears: gears of dim {dim} must be a non-empty list of positive ints, "
                            f"got {values!r}")
        ints = []
        for v in values:
            try:
                iv = operator.index(v)  # ints, numpy integers, 0-d integer tensors
            except TypeError:
                iv = None
            if isinstance(v, bool) or iv is None or iv <= 0:
                raise GearError(f"set_dim_gears: gear value {v!r} of dim {dim} is not allowed; "
                                f"gear values must be positive ints, got {list(values)}")
            if iv > MAX_GEAR_SIZE:
                raise GearError(f"set_dim_gears: gear value {iv} of dim {dim} is larger than any tensor size can be "
                                f"(torch sizes are int64: at most 2**63 - 1)")
            ints.append(iv)
        if len(set(ints)) > MAX_GEARS:
            raise GearError(f"set_dim_gears: dim {dim} has {len(set(ints))} distinct gears; at most {MAX_GEARS} "
                            "gears are allowed in total")
        normalized[d] = tuple(ints)
    existing: dict = getattr(tensor, _ATTR, {})
    if existing and existing != normalized:
        have = {d: list(v) for d, v in sorted(existing.items())}
        want = {d: list(v) for d, v in sorted(normalized.items())}
        raise GearError(f"set_dim_gears: this tensor already has gears {have}; the same tensor cannot be given "
                        f"different gears {want} (set them once, with every dim)")
    setattr(tensor, _ATTR, normalized)
    size_oblivious.turn_on()
    for d, values in normalized.items():
        # Traced at the largest gear, whatever size this call has (`retrace_at_own_sizes`).
        torch._dynamo.mark_dynamic(tensor, d, hint_override=max(values))
    with _hinted_lock:
        _hinted[id(tensor)] = tensor
        _unread[id(tensor)] = tensor


# Tensors whose geared dims carry the largest gear as Dynamo's size hint (set_dim_gears's docstring).
_hinted: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()
_hinted_lock = threading.Lock()
# Marked tensors no compile has read yet: a mark on a tensor the first call does not pass is a mistake
# that would otherwise go unseen (the gears live on the tensor, so another tensor has none).
_unread: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()


def _note_marks_read(example_inputs) -> None:
    """Forget the marks this compile read; warn once about marks still unread when it read none."""
    with _hinted_lock:
        read = [id(x) for x in example_inputs if isinstance(x, torch.Tensor) and id(x) in _unread]
        for key in read:
            _unread.pop(key, None)
        stray = [] if read else list(_unread.values())
        for t in stray:
            _unread.pop(id(t), None)
    for t in stray:
        log.warning("set_dim_gears: a tensor of shape %s has gears %s, but the graph being compiled does not take "
                    "it as an input, so they have no effect; gears are read from the first call's own input tensors "
                    "(mark the tensor you pass to that call)", list(t.shape), get_dim_gears(t))


def retrace_at_own_sizes() -> bool:
    """Drop the largest-gear size hints of the tensors `set_dim_gears` marked, so Dynamo traces them at
    their own sizes; True when any had one. For a call whose own gear the largest-gear trace cannot
    serve (the model's code branches on the size): its trace restarts at its own size, as without hints."""
    with _hinted_lock:
        tensors = list(_hinted.values())
        _hinted.clear()
    dropped = False
    for t in tensors:
        hints = getattr(t, "_dynamo_hint_overrides", None)
        if hints:
            hints.clear()
            dropped = True
    return dropped


def get_dim_gears(tensor) -> dict:
    """The gears `set_dim_gears` recorded on ``tensor`` ({} if none)."""
    return dict(getattr(tensor, _ATTR, {}) or {})


class SizeObliviousFlag:
    """The one owner of torch's ``torch.fx.experimental._config.backed_size_oblivious``.

    `set_dim_gears` turns the flag on (its docstring says why); `restore` puts back the value it
    had before, once: when the geared graph first runs (`GearDispatcher`), or when a compile fails
    (`restored_on_failure`, around the backend's compile), since a graph that failed never runs.
    """

    def __init__(self):
        self._before: bool | None = None  # the flag's value before we turned it on; None while we do not hold it

    def turn_on(self) -> None:
        cfg = torch.fx.experimental._config
        if self._before is None:
            self._before = cfg.backed_size_oblivious
            log.debug("set_dim_gears: backed_size_oblivious on until the geared graph first runs")
        cfg.backed_size_oblivious = True

    def restore(self) -> None:
        if self._before is not None:
            torch.fx.experimental._config.backed_size_oblivious, self._before = self._before, None

    @contextlib.contextmanager
    def restored_on_failure(self):
        """Restore the flag if the body raises; a restart of Dynamo's analysis is no failure (it traces again)."""
        try:
            yield
        except torch._dynamo.exc.RestartAnalysis:
            raise
        except BaseException:
            self.restore()
            raise


size_oblivious = SizeObliviousFlag()
restore_size_oblivious = size_oblivious.restore


@dataclasses.dataclass(frozen=True)
class InputGears:
    """The gears declared on one graph input."""

    index: int  # position among the graph's inputs
    name: str  # what the user calls it (Dynamo's source name when known)
    dims: dict  # {dim: (values...)}
    shape: tuple  # the example input's shape, for the log
    declared: dict = dataclasses.field(default_factory=dict)  # {dim: gears.declared.Declared}: gears from a range

    def combos(self, policy: str) -> list[dict]:
        """This tensor's own gears: a list of {dim: value}."""
        dims = sorted(self.dims)
        if policy == "zip":
            lengths = {d: len(self.dims[d]) for d in dims}
            if len(set(lengths.values())) > 1:
                raise GearError(f"input {self.name}: with dynamic_gears_merge_policy='zip' every dim's gear list must "
                                f"have the same length, got lengths {lengths}; use equal lengths or 'product'")
            return [dict(zip(dims, values)) for values in zip(*(self.dims[d] for d in dims))]
        return [dict(zip(dims, values)) for values in itertools.product(*(self.dims[d] for d in dims))]


@dataclasses.dataclass(frozen=True)
class GearSpec:
    """All gears of one graph: which inputs carry them and the merged list of gears.

    ``gears`` holds one dict per gear, ``{(input index, dim): size}``, in declaration order and
    without duplicates.
    """

    inputs: tuple  # of InputGears
    gears: tuple  # of dict[(int, int), int]
    policy: str
    # {(input index, dim): size} of the call being compiled (None: no call, e.g. a loaded export)
    example: dict | None = None
    # gears made from declared ranges (gears.declared): sizes between them are padded, or run the dynamic graph
    declared: bool = False

    def allowed(self, index: int, dim: int) -> list[int]:
        """The sizes dimension ``dim`` of input ``index`` takes across the gears (sorted)."""
        return sorted({g[(index, dim)] for g in self.gears})

    def input(self, index: int) -> InputGears:
        return next(i for i in self.inputs if i.index == index)

    def fallback(self, configured: str) -> str:
        """What serves a size that is no gear, given ``config.inference_config.gear_fallback``: as configured,
        except that declared ranges never refuse a size inside them ("error" becomes "pad": padded where that is
        safe, else the dynamic graph runs)."""
        return "pad" if self.declared and configured == "error" else configured


def merge_gears(inputs: list[InputGears], policy: str, symbols: dict | None = None) -> list[dict]:
    """Combine the tensors' gear lists with ``policy``; at most MAX_GEARS gears.

    Under "product" the unit of combination is a gear *axis*, not a dim: dims that are one size are one axis
    (`gear_axes`), so a model's ``input_ids`` and ``attention_mask`` declared alike over batch and sequence make
    |batch| x |sequence| gears, not their square. ``symbols`` ({(input index, dim): size symbol}) says which
    dims the trace made one size; without it, only the declarations say so."""
    if policy not in ("zip", "product"):
        raise GearError(f"dynamic_gears_merge_policy = {policy!r} is not allowed; choose 'zip' or 'product'")
    if policy == "zip":
        per_input = [[{(i.index, d): v for d, v in combo.items()} for combo in i.combos(policy)] for i in inputs]
        counts = {i.name: len(c) for i, c in zip(inputs, per_input)}
        if len(set(counts.values())) > 1:
            raise GearError(f"with dynamic_gears_merge_policy='zip' every input must have the same number of gears, "
                            f"got {counts}; make them equal or use 'product'")
        gears = _distinct(_merged(row) for row in zip(*per_input))
        total = len(gears)
    else:
        axes = gear_axes(inputs, symbols)
        total = math.prod(len(values) for _, values in axes)
        gears = [_merged([{k: v for k in keys} for (keys, _), v in zip(axes, row)])
                 for row in itertools.product(*(values for _, values in axes))] if total <= MAX_GEARS else []
    if total > MAX_GEARS:
        raise GearError(f"{total} gears declared ({policy} of {', '.join(i.name for i in inputs)}, repeats counted "
                        f"once); at most {MAX_GEARS} gears are allowed")
    return gears


def gear_axes(inputs: list[InputGears], symbols: dict | None = None) -> list[tuple[list, list]]:
    """The gear axes of the declared dims, each ``([(input index, dim), ...], [sizes...])``, in declaration order.

    Two dims are one axis, one size in every gear, when the trace made them one size symbol (``symbols``), or when
    they are the same dim of two inputs declared with the same gears and of the same size in the call being
    compiled: a model's ``input_ids`` and ``attention_mask`` (bert reads its mask only by index, so the trace keeps
    their batch sizes apart; a call always has them equal). Dims of one input are never merged by their
    declarations alone. An axis whose dims were declared with different gears takes the sizes they share."""
    symbols = symbols or {}
    keys = [(i.index, d) for i in inputs for d in sorted(i.dims)]
    info = {(i.index, d): (i, d) for i in inputs for d in i.dims}

    def one_size(a, b) -> bool:
        (ia, da), (ib, db) = info[a], info[b]
        same_symbol = symbols.get(a) is not None and symbols.get(a) == symbols.get(b)
        declared_alike = (ia.index != ib.index and da == db and ia.dims[da] == ib.dims[db]
                          and da < len(ia.shape) and db < len(ib.shape) and ia.shape[da] == ib.shape[db])
        return same_symbol or declared_alike

    out = []
    for members in connected_groups(keys, [(a, b) for a, b in itertools.combinations(keys, 2) if one_size(a, b)]):
        values = list(dict.fromkeys(info[members[0]][0].dims[info[members[0]][1]]))
        for k in members[1:]:
            i, d = info[k]
            values = [v for v in values if v in i.dims[d]]
        if not values:
            where = ", ".join(f"{info[k][0].name} dim {info[k][1]}" for k in members)
            raise GearError(f"{where} are one size in the traced graph but were given gears with no size in common "
                            f"({', '.join(str(list(info[k][0].dims[info[k][1]])) for k in members)}); give them the "
                            "same gears")
        out.append((members, values))
    return out


def _merged(parts) -> dict:
    gear: dict = {}
    for part in parts:
        gear.update(part)
    return gear


def _distinct(gears) -> list[dict]:
    """The gears without repeats, in first-seen order (a value repeated in a list is one gear)."""
    out, seen = [], set()
    for gear in gears:
        key = tuple(sorted(gear.items()))
        if key not in seen:
            seen.add(key)
            out.append(gear)
    return out


def collect_gear_specs(example_inputs, config, gm=None) -> GearSpec | None:
    """The gears recorded on the example inputs by `set_dim_gears`, merged; else gears made from the ranges the
    user declared (`mark_dynamic(min=, max=)`, ``shapes_spec``: `rewrite.gears.declared`); None when there are none."""
    from .declared import declared_dims

    _note_marks_read(example_inputs)
    names = dynamo_input_names(gm, len(example_inputs))
    declared = declared_dims(gm, example_inputs)
    _refuse_sizes_outside_shape_vars(declared, example_inputs, names)
    inputs = [InputGears(i, names[i], get_dim_gears(x), tuple(x.shape))
              for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor) and get_dim_gears(x)]
    if not inputs:
        return _declared_gear_spec(declared, example_inputs, config, gm, names)
    policy = config.inference_config.dynamic_gears_merge_policy
    example = {(i.index, d): i.shape[d] for i in inputs for d in i.dims}
    symbols = {(i.index, d): _size_symbol(gm, example_inputs, i.index, d) for i in inputs for d in i.dims}
    return GearSpec(tuple(inputs), tuple(merge_gears(inputs, policy, symbols)), policy, example)


def _refuse_sizes_outside_shape_vars(declared_dims: dict, example_inputs, names) -> None:
    """Raise `OutsideDeclaredRange` when the call being traced has a size outside its ShapeVar's range."""
    for (i, d), declared in sorted(declared_dims.items()):
        size = example_inputs[i].shape[d]
        if declared.var is not None and isinstance(size, int) and not declared.contains(size):
            raise OutsideDeclaredRange(
                f"input {argument_path(names[i])} dim {d} has size {size}, outside the range {declared.describe()} "
                f"(shapes_spec); call with a size in [{declared.lower}, "
                f"{'oo' if declared.upper is None else declared.upper}] or widen the ShapeVar's range")


def _declared_gear_spec(declared: dict, example_inputs, config, gm, names) -> GearSpec | None:
    """Gears for the declared dims, one gear axis per size. Dims Dynamo traced with one size symbol (a model's
    input_ids and attention_mask batch, when the model broadcasts one against the other) are one group: one size in
    every gear. With ``dynamic_gears_merge_policy`` "zip" (the default), groups declared with the same range (the
    batch dims of several inputs, each its own symbol; or the dims of one ShapeVar) are one axis too: they take their
    gears together. Axes combine as every combination of their gears (batch x sequence); under "product" every
    group is an axis of its own. ``declared_gears`` gives one list for every dim, or a list per axis
    (`declared_gears_for`)."""
    from .declared import LADDER_GEARS, declared_gears_for, ladder

    if not declared:
        return None
    groups: dict = {}  # size symbol (or the dim itself) -> [(input index, dim), ...]
    for key in sorted(declared):
        groups.setdefault(_size_symbol(gm, example_inputs, *key) or key, []).append(key)
    chosen = config.inference_config.declared_gears
    zip_policy = config.inference_config.dynamic_gears_merge_policy == "zip"
    axes: dict = {}  # the range's bounds (zip) or the group -> [(input index, dim), ...]
    for group, dims in groups.items():
        r = _common_range([declared[k] for k in dims])
        axes.setdefault((r.lower, r.upper, r.hint) if zip_policy else group, []).extend(dims)
    per_axis = max(2, int(LADDER_GEARS ** (1 / len(axes))))  # every combination is compiled: ~LADDER_GEARS in all
    by_input: dict = {}
    per_axis_gears = []
    used = set()
    for dims in axes.values():
        d = _common_range([declared[k] for k in dims])
        labels = [f"{argument_path(names[i])}:{dim}" for i, dim in dims]
        sizes, key = declared_gears_for(chosen, [declared[k] for k in dims], labels)
        used.add(key)
        values = sorted({v for v in sizes if d.contains(v)}) if sizes is not None else ladder(d, per_axis)
        where = ", ".join(f"input {names[i]} dim {dim}" for i, dim in dims)
        if not values:
            log.info("gears: %s: %s, which makes no gears%s; it stays dynamic", where, d.describe(),
                     "" if sizes is not None else " (no upper bound)")
            continue
        for index, dim in dims:
            by_input.setdefault(index, ({}, {}))
            by_input[index][0][dim] = tuple(values)
            by_input[index][1][dim] = declared[(index, dim)]
        per_axis_gears.append([{k: v for k in dims} for v in values])
    if isinstance(chosen, dict) and set(chosen) - used:
        log.warning("gears: inference_config.declared_gears names %s, which no declared dim of this graph is "
                    "(keys are ShapeVar names or 'argument:dim', e.g. 'input_ids:1')", sorted(set(chosen) - used))
    inputs = [InputGears(i, names[i], dims, tuple(example_inputs[i].shape), ranges)
              for i, (dims, ranges) in sorted(by_input.items())]
    if not inputs:
        return None
    total = math.prod(len(g) for g in per_axis_gears)
    if total > MAX_GEARS:
        raise GearError(f"{total} gears from the declared shapes (every combination of {len(per_axis_gears)} gear "
                        f"axes' gears: {' x '.join(str(len(g)) for g in per_axis_gears)}); at most {MAX_GEARS} gears "
                        "are allowed: give inference_config.declared_gears fewer sizes (a list per axis: "
                        "{'batch': [...], 'input_ids:1': [...]})")
    log.info("gears: from declared shapes: %s", "; ".join(
        f"{i.name} dim {d}: {i.declared[d].describe()}, gears {list(v)}" for i in inputs for d, v in i.dims.items()))
    rows = itertools.product(*per_axis_gears)
    return GearSpec(tuple(inputs), tuple(_merged(row) for row in rows), "product", None, declared=True)


def _size_symbol(gm, example_inputs, index: int, dim: int) -> str | None:
    """The symbol Dynamo traced dim ``dim`` of input ``index`` with (after its replacements: a guard that two
    sizes are equal makes them one symbol), or None when the trace left no symbol to read."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"] if gm is not None else []
    candidates = [example_inputs[index]]
    if index < len(placeholders):
        candidates.append(placeholders[index].meta.get("example_value"))
    for t in candidates:
        if not isinstance(t, torch.Tensor) or dim >= t.dim() or not isinstance(t.shape[dim], torch.SymInt):
            continue
        node = t.shape[dim].node
        try:
            return str(node.shape_env.replace(node.expr))
        except Exception:  # noqa: BLE001 - a ShapeEnv without replace(): the symbol as traced
            return str(node.expr)
    return None


def _common_range(ranges: list):
    """The sizes every one of ``ranges`` allows (dims of one size symbol): one `Declared` naming them all."""
    if len(ranges) == 1:
        return ranges[0]
    from .declared import Declared

    uppers = [r.upper for r in ranges if r.upper is not None]
    hints = [r.hint for r in ranges if r.hint is not None]
    return Declared(" and ".join(dict.fromkeys(r.name for r in ranges)), max(r.lower for r in ranges),
                    min(uppers) if uppers else None, hints[0] if hints else None)
