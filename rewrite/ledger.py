"""No silent slow path: every call that runs slower than the static graph the user asked for is counted
per compiled function, and ``config.strict = True`` makes it an error that names the cause and the fix.

Serving stacks lose throughput to paths nobody sees: a shape off the capture ladder that silently
disables CUDA graphs (vllm-ascend#16049: decode 7.5x slower), padding batch 9 to 16 (vllm#12920).
Here each of them is a line in the function's `Ledger`:

======================  =============================================================================
``pads``                calls padded up to a larger gear (``gear_fallback="pad"``); ``padded_rows``:
                        the padding they computed, in elements of the padded dims
``splits``              calls run as several gears' runs, split along a gear axis (``gear_fallback="fit"``); their
                        padded parts count in ``padded_rows`` too
``dynamic_fallbacks``   calls no gear served that ran the symbolic graph (``gear_fallback="dynamic"``)
``recompiles``          Dynamo graphs compiled for a function after its first (a retrace)
``uncaptured``          calls of a CUDA gear that ran without its CUDA graph (capture failed, limit reached)
``tier_up_refused``     static graphs that will not tier up, and why (random draws, effects, a failed build)
``tier_up_pending``     calls past the cold calls that still ran the ATen code: the hot build was not ready
``aten_fallbacks``      ops of a planned graph that run ATen code where a static kernel was built for them
                        and could not be used
``refreezes``           graphs compiled again because weights frozen into them changed (`rewrite.frozen`)
``tokens_computed``     ``padded_tokens="skip"`` was asked and refused: a request's padding is computed, and why
======================  =============================================================================

``gears`` counts the calls each gear served; ``regroups`` the calls whose rows ran in groups cut to their own
length (``padded_tokens="skip"``, `rewrite.gears.regroup`), and ``skipped_tokens`` the positions they did not compute
(batch x sequence elements). `rewrite.stats(compiled)` returns a snapshot (`Stats`);
`rewrite.explain` prints the ledger. Counting costs one uncontended lock per slow event and per call of a
gear, nothing else on the fast path.
"""
from __future__ import annotations

import dataclasses
import logging
import threading

log = logging.getLogger("rewrite")

__all__ = ["Ledger", "Stats", "SlowPathError", "SLOW_PATHS"]

# kind -> what it means, for messages
SLOW_PATHS = {
    "pads": "a call was padded up to a larger gear",
    "splits": "a call was split into several gears' runs",
    "dynamic_fallbacks": "a call no gear serves ran the dynamic (symbolic) graph",
    "recompiles": "Dynamo compiled another graph for the function (a retrace)",
    "uncaptured": "a CUDA gear ran without its CUDA graph",
    "tier_up_refused": "a static graph will not tier up",
    "tier_up_pending": "a call ran the ATen code because the graph's tier-up build was not ready",
    "aten_fallbacks": "an op ran ATen code where a static kernel was expected",
    "refreezes": "frozen weights changed, and their graph was compiled again",
    "tokens_computed": "padded tokens are computed (padded_tokens='skip' is not possible)",
}
MAX_EVENTS = 64  # explanations kept per function (the counts keep counting)


class SlowPathError(RuntimeError):
    """``config.strict = True``: a call would have taken a slow path. The message names the cause and the fix."""

    def __init__(self, kind: str, message: str, fix: str):
        self.kind = kind
        super().__init__(f"{SLOW_PATHS[kind]}: {message}. Fix: {fix} (config.strict = True turns slow paths "
                         "into this error; rewrite.stats(compiled_fn) counts them instead)")


@dataclasses.dataclass(frozen=True)
class Stats:
    """A snapshot of one compiled function's ledger (`rewrite.stats`)."""

    pads: int = 0
    padded_rows: int = 0
    splits: int = 0
    dynamic_fallbacks: int = 0
    recompiles: int = 0
    uncaptured: int = 0
    tier_up_refused: int = 0
    tier_up_pending: int = 0
    aten_fallbacks: int = 0
    refreezes: int = 0
    tokens_computed: int = 0
    regroups: int = 0  # calls run as groups of rows cut to their own length (not a slow path)
    skipped_tokens: int = 0  # the padded positions those calls did not compute
    gears: dict = dataclasses.field(default_factory=dict)  # gear key -> calls it served
    events: tuple = ()  # (kind, message) of the first slow paths, oldest first

    @property
    def slow_paths(self) -> int:
        return sum(getattr(self, k) for k in SLOW_PATHS)

    def __str__(self) -> str:
        counts = ", ".join(f"{k} {getattr(self, k)}" for k in SLOW_PATHS if getattr(self, k))
        lines = [f"slow paths: {counts or 'none'}" + (f" (padded rows {self.padded_rows})" if self.padded_rows else "")]
        if self.regroups:
            lines.append(f"regrouped calls: {self.regroups} ({self.skipped_tokens} padded tokens skipped)")
        if self.gears:
            lines.append("calls per gear: " + ", ".join(f"{k}: {v}" for k, v in self.gears.items()))
        said: dict = {}  # one line per distinct event, with how often it was kept
        for event in self.events:
            said[event] = said.get(event, 0) + 1
        lines += [f"  {kind}: {msg}" + (f" ({n} times)" if n > 1 else "") for (kind, msg), n in said.items()]
        return "\n".join(lines)


class Ledger:
    """The slow-path counts of one compiled function (one ``torch.compile`` call, all its graphs and gears)."""

    def __init__(self, strict: bool = False):
        self.strict = strict
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(SLOW_PATHS, 0)
        self._padded_rows = 0
        self._regroups = [0, 0]  # calls, skipped tokens
        self._gears: dict = {}
        self._events: list = []

    def slow(self, kind: str, message: str, fix: str, *, n: int = 1, padded_rows: int = 0) -> None:
        """Count ``n`` slow paths of ``kind``; in strict mode raise `SlowPathError` instead (nothing counted)."""
        if kind not in SLOW_PATHS:
            raise ValueError(f"unknown slow path {kind!r}; known: {sorted(SLOW_PATHS)}")
        if self.strict:
            raise SlowPathError(kind, message, fix)
        with self._lock:
            first = self._counts[kind] == 0
            self._counts[kind] += n
            self._padded_rows += padded_rows
            if len(self._events) < MAX_EVENTS:
                self._events.append((kind, message))
        if first:  # said once per kind; the counts say how often
            log.info("rewrite: slow path: %s: %s (counted in rewrite.stats; fix: %s)", SLOW_PATHS[kind], message, fix)

    def on_first_call(self, fn, kind: str, message: str, fix: str, keep: tuple = ()):
        """For a slow path found while compiling: counted now, and ``fn`` returned as it is; in strict mode
        ``fn`` wrapped so its first call raises `SlowPathError` (raised inside a compile, Dynamo would wrap it
        in BackendCompilerFailed: the caller should see it on a call). ``keep``: attributes of ``fn`` the
        wrapper must carry too."""
        if not self.strict:
            self.slow(kind, message, fix)
            return fn
        said = []

        def first_call_raises(*args, **kwargs):
            if not said:
                said.append(True)
                self.slow(kind, message, fix)
            return fn(*args, **kwargs)

        for name in keep:
            if hasattr(fn, name):
                setattr(first_call_raises, name, getattr(fn, name))
        return first_call_raises

    def served(self, gear) -> None:
        """Count a call served by ``gear``."""
        with self._lock:
            self._gears[gear] = self._gears.get(gear, 0) + 1

    def regrouped(self, skipped_tokens: int) -> None:
        """Count a call run as groups of rows cut to their own length, and the padded positions it skipped."""
        with self._lock:
            self._regroups[0] += 1
            self._regroups[1] += skipped_tokens

    def stats(self) -> Stats:
        with self._lock:
            return Stats(**self._counts, padded_rows=self._padded_rows, regroups=self._regroups[0],
                         skipped_tokens=self._regroups[1], gears=dict(self._gears), events=tuple(self._events))
