"""Recording the sizes compiled functions are called with: the traffic `plan_gears` plans gears for.

    with rewrite.gears.recording() as rec:
        for batch in traffic:
            model(batch)                      # compiled with gears, or with dynamic=True
    plan = rewrite.gears.plan_gears(rec, max_gears=6)

What is recorded, per compiled function and dimension (a `Stream`), is a histogram ``{size: calls}``:
bounded by the number of distinct sizes, not by the number of calls. Recording is process-wide (calls
on every thread count, under one lock per recording) and costs nothing measurable when off: the hooks
read one module global per call.

The hooks sit where a compiled graph reads its input sizes anyway:

* a geared graph: `GearDispatcher.__call__`, which reads the gear key to pick a static graph; the key is
  what is recorded (the size asked for, before any padding);
* a symbolic graph without gears (``torch.compile(dynamic=True)``, or a dim Dynamo made dynamic by
  itself): a thin wrapper around the graph's callable (`recorded`), made at compile time only for graphs
  whose sizes are symbols of their inputs; it reads those sizes only while a recording is open;
* a graph Dynamo specialized to size 0 or 1 of such a dim (it does so for every backed size): the same
  wrapper around that static graph, counting its constant size, when the graph was traced with
  ``dynamic=True`` or the function already has a symbolic graph for that dim. Without this a batch-1
  call (the most frequent size of much traffic) would never be recorded.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading

from .spec import GearError

log = logging.getLogger("rewrite")

__all__ = ["recording", "Recording", "Stream", "recorded", "function_name"]

MAX_SIZES_PER_STREAM = 1 << 16  # distinct sizes kept per stream; more are counted in `Recording.dropped`

# The open recordings (a tuple), or None: the one global the hooks read per call.
active: tuple | None = None
_open_lock = threading.Lock()
# function name -> labels ("input x dim 0") some symbolic graph of it records: a graph of the same
# function that Dynamo specialized to size 0/1 in one of these dims records that size too.
_symbolic_dims: dict[str, set] = {}


@dataclasses.dataclass(frozen=True, order=True)
class Stream:
    """One recorded dimension: the compiled function and the input dimension, as the user names them."""

    function: str  # "forward (model.py:12)", "BertModel.forward (modeling_bert.py:880)"
    dim: str  # "input x dim 0", as gear errors name it

    def __str__(self) -> str:
        return f"{self.function}: {self.dim}" if self.function else self.dim


class Recording:
    """Histograms of the sizes each recorded dimension took: ``{Stream: {size: calls}}``."""

    def __init__(self):
        self._lock = threading.Lock()
        self._hist: dict = {}
        self.dropped = 0  # calls whose size was not kept because its stream had MAX_SIZES_PER_STREAM sizes

    def _add(self, streams, key) -> None:
        with self._lock:
            for stream, size in zip(streams, key):
                hist = self._hist.get(stream)
                if hist is None:
                    hist = self._hist[stream] = {}
                if size in hist:
                    hist[size] += 1
                elif len(hist) < MAX_SIZES_PER_STREAM:
                    hist[size] = 1
                else:
                    self.dropped += 1

    @property
    def streams(self) -> dict:
        """``{Stream: {size: calls}}`` (a copy), streams in the order first recorded."""
        with self._lock:
            return {s: dict(sorted(h.items())) for s, h in self._hist.items()}

    def histogram(self, stream=None) -> dict:
        """``{size: calls}`` of one stream: `Stream`, or a part of its name (``"x dim 0"``); None: the only
        stream, or the only one that took more than one size (or the first of several that took the same sizes
        as often: the dims of one size symbol, input_ids and attention_mask dim 0 of a model, say)."""
        return self.select(stream)[1]

    def select(self, stream=None) -> tuple[str, dict]:
        """(the stream's name, its histogram); see `histogram`."""
        streams = self.streams
        if not streams:
            raise GearError("plan_gears: the recording is empty: no compiled function with geared or dynamic dims "
                            "ran inside `with rewrite.gears.recording()` (a static graph records nothing; compile "
                            "with gears or dynamic=True)")
        if self.dropped:
            log.warning("gears: the recording kept at most %d distinct sizes per stream; %d calls were not counted",
                        MAX_SIZES_PER_STREAM, self.dropped)
        if isinstance(stream, Stream):
            if stream not in streams:
                raise GearError(f"plan_gears: stream {stream} was not recorded; recorded: {self._names(streams)}")
            return str(stream), streams[stream]
        if stream is None:
            if len(streams) == 1:
                (s, h), = streams.items()
                return str(s), h
            varying = [s for s, h in streams.items() if len(h) > 1]
            if len(varying) == 1:
                return str(varying[0]), streams[varying[0]]
            if len(varying) > 1 and all(streams[s] == streams[varying[0]] for s in varying):
                # the dims of one size symbol (input_ids and attention_mask dim 0 of a model) took the same
                # traffic: each gives the same plan; the first recorded is named
                return str(varying[0]), streams[varying[0]]
            raise GearError(f"plan_gears: the recording has {len(streams)} streams ({len(varying)} took more than "
                            f"one size); pick one with stream=: {self._names(streams)}")
        if not isinstance(stream, str):
            raise GearError(f"plan_gears: stream must be a Stream or a part of its name (str), got {stream!r}")
        found = [s for s in streams if stream in str(s)]
        exact = [s for s in found if str(s) == stream or s.dim == stream]
        if len(found) == 1 or len(exact) == 1:
            s = found[0] if len(found) == 1 else exact[0]
            return str(s), streams[s]
        what = "matches none" if not found else f"matches {len(found)}"
        raise GearError(f"plan_gears: stream={stream!r} {what} of the recorded streams: {self._names(streams)}")

    @staticmethod
    def _names(streams: dict) -> str:
        return "; ".join(f"'{s}' ({len(h)} sizes)" for s, h in streams.items())

    def clear(self) -> None:
        with self._lock:
            self._hist.clear()
            self.dropped = 0

    def __len__(self) -> int:
        """Calls recorded (the first stream of each call counts it once per stream)."""
        with self._lock:
            return sum(sum(h.values()) for h in self._hist.values())

    def describe(self) -> str:
        streams = self.streams
        if not streams:
            return "recording: no calls"
        lines = [f"recording: {len(streams)} stream(s)"]
        for s, h in streams.items():
            calls = sum(h.values())
            top = sorted(h.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
            lines.append(f"  {s}: {calls} calls, {len(h)} sizes in [{min(h)}, {max(h)}]; most frequent "
                         + ", ".join(f"{k} ({v})" for k, v in top))
        return "\n".join(lines)

    __str__ = describe

    def __repr__(self) -> str:
        return f"<Recording of {len(self._hist)} stream(s)>"


@contextlib.contextmanager
def recording(into: Recording | None = None):
    """Record the sizes of every geared or dynamic dim of every compiled function called inside, on any
    thread; yields the `Recording` (``into``, to add to an earlier one). Recordings may nest."""
    global active
    if into is not None and not isinstance(into, Recording):
        raise GearError(f"recording: into must be a Recording (to add to it), got {type(into).__name__}")
    rec = into if into is not None else Recording()
    with _open_lock:
        active = (active or ()) + (rec,)
    try:
        yield rec
    finally:
        with _open_lock:
            rest = tuple(r for r in (active or ()) if r is not rec)
            active = rest or None


def note(recs: tuple, streams, key) -> None:
    """Count one call with sizes ``key`` (one per stream) in every open recording."""
    for rec in recs:
        rec._add(streams, key)


def function_name(unit) -> str:
    """The user's function a unit's graph was traced from ("forward (model.py:12)"), else the unit's name."""
    origin = getattr(unit, "origin", None)
    return origin.function if origin is not None and origin.function else unit.name


def dim_label(unit, index: int, dim: int) -> str:
    """How gear errors name a graph input's dim: ``input x dim 0``."""
    from ..fx_bridge import argument_path

    origin = getattr(unit, "origin", None)
    names = origin.input_names if origin is not None else ()
    name = argument_path(names[index]) if index < len(names) and names[index] else str(index)
    return f"input {name} dim {dim}"


def register_symbolic(function: str, labels) -> None:
    """``function`` has a graph whose ``labels`` dims are symbols (a later size-0/1 specialization records)."""
    with _open_lock:
        _symbolic_dims.setdefault(function, set()).update(labels)


def recorded(fn, graph, unit):
    """``fn`` (the callable of ``graph``, without gears), recording the sizes of its dynamic dims while a
    recording is open; ``fn`` itself when it has none (see the module's docstring for which)."""
    import operator

    from ..ir import TensorMeta

    if unit.kind == "backward":
        return fn
    function = function_name(unit)
    placeholders = graph.placeholders
    streams, readers, constant = [], [], []
    if not graph.is_static():
        for sym, info in sorted(graph.symbols.items(), key=lambda kv: str(kv[0])):
            if info.input_index is None or info.dim is None or info.input_index >= len(placeholders):
                continue  # only a SymInt input: no dimension to name
            if info.scalar_input_index is not None:
                read = operator.itemgetter(info.scalar_input_index)
            else:
                read = _shape_reader(info.input_index, info.dim)
            # Every input dim that IS this symbol is a stream: Dynamo names a symbol after one input (a decoder's
            # attention_mask dim 0), but input_ids dim 0 took the same sizes. Recorded under one name only, the
            # other dim's stream held just the calls of a graph Dynamo specialized to batch 1 (which records
            # each of its size-1 dims), and plan_gears(rec, stream="input_ids dim 0") planned for that part.
            for i, d in [(info.input_index, info.dim)] + _same_size(sym, placeholders, unit, info):
                streams.append(Stream(function, dim_label(unit, i, d)))
                readers.append(read)
        register_symbolic(function, [s.dim for s in streams])
    origin = getattr(unit, "origin", None)
    if origin is not None:  # dims Dynamo specialized to 0 or 1 (sizes it never leaves symbolic)
        with _open_lock:
            known = set(_symbolic_dims.get(function, ()))
        symbolic = {s.dim for s in streams}
        for i, p in enumerate(placeholders):
            meta = p.meta
            if i in unit.weights or not isinstance(meta, TensorMeta) or meta.shape is None:
                continue
            for d, size in enumerate(meta.shape):
                label = dim_label(unit, i, d)
                if label in symbolic or not _is_int(size) or int(size) not in (0, 1):
                    continue
                if origin.dynamic or label in known:
                    constant.append((Stream(function, label), int(size)))
    if not streams and not constant:
        return fn
    all_streams = tuple(streams) + tuple(s for s, _ in constant)
    values = tuple(v for _, v in constant)
    readers = tuple(readers)
    log.debug("gears: %s records %s while a recording is open", graph.name, ", ".join(map(str, all_streams)))

    def call(*args):
        recs = active
        if recs is not None:
            note(recs, all_streams, tuple(read(args) for read in readers) + values)
        return fn(*args)

    call.__wrapped__ = fn
    return call


def _same_size(sym, placeholders, unit, info) -> list:
    """(input index, dim) of the other input dims whose size is exactly ``sym``."""
    from ..ir import TensorMeta

    out = []
    for i, p in enumerate(placeholders):
        if i in unit.weights or not isinstance(p.meta, TensorMeta) or p.meta.shape is None:
            continue
        for d, size in enumerate(p.meta.shape):
            if (i, d) != (info.input_index, info.dim) and not _is_int(size) and size == sym:
                out.append((i, d))
    return out


def _shape_reader(i: int, d: int):
    return lambda args: args[i].shape[d]


def _is_int(size) -> bool:
    return isinstance(size, int) or getattr(size, "is_Integer", False) is True
