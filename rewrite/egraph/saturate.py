"""Running rulesets under node, time and iteration limits, interleaved with meta inference.

One round: every ruleset in schedule order, each for up to its ``iterations`` (one egglog
iteration at a time, so limits are checked between iterations); then the metas of e-classes that
rules created are inferred in Python and the ``accept`` ruleset unions each replacement whose
meta equals the matched expression's. Rounds repeat until nothing changes or a limit is hit;
hitting a limit keeps the e-graph as it is (every e-class still holds its original term, so
extraction always has a valid graph) and says so in the log.
"""
from __future__ import annotations

import dataclasses
import logging
import time

from .encode import MATCH_SUFFIX, PENDING_SUFFIX
from ..ops import OpError, split_args, target_from_name
from .decode import VALUE_OPS, Decoder, literal_meta
from .load import describe_commands, send_rows
from .names import Namer
from .snapshot import Snapshot, raw_metas
from .terms import TERM_CONSTRUCTORS, Tables, is_call

log = logging.getLogger("rewrite")
META_BATCH = 8  # commands per egglog program: each costs ~0.1 ms however they are grouped, and long programs parse slowly


@dataclasses.dataclass
class Limits:
    node_limit: int = 200_000
    time_limit_s: float = 10.0
    iteration_limit: int = 30


@dataclasses.dataclass
class SaturationResult:
    fired: dict                      # rule name -> matches applied
    rounds: int = 0
    stopped_by: str | None = None    # "node limit", "time limit", "iteration limit" or None (saturated)
    metas_inferred: int = 0


def _run(egraph, text: str):
    return egraph.run_program(*egraph.parse_program(text))


def egraph_size(egraph) -> int:
    """Number of e-nodes of the term language (what the node limit bounds; bookkeeping excluded)."""
    out = _run(egraph, "(print-size)")
    total = 0
    for item in out:
        sizes = getattr(item, "sizes", None)
        if sizes is not None:
            total += sum(n for name, n in sizes if name in TERM_CONSTRUCTORS or is_call(name))
    return total


def _pending_size(egraph) -> int:
    out = _run(egraph, "(print-size Pending)")
    for item in out:
        size = getattr(item, "size", None)
        if size is not None:
            return size
    return 0


def _count(result: SaturationResult, report) -> None:
    """Add a run's firings: variable replacements that matched (their query holds the meta
    guard) and op replacements that ``accept`` unioned; proposals and stage-one matches are not."""
    for rule, n in report.num_matches_per_rule.items():
        if n and not rule.endswith((MATCH_SUFFIX, PENDING_SUFFIX)) and "/" in rule:
            short = rule.split("/", 1)[-1]
            result.fired[short] = result.fired.get(short, 0) + n


class Saturator:
    def __init__(self, egraph, tables: Tables, limits: Limits, symbols=None):
        self.egraph = egraph
        self.tables = tables
        self.limits = limits
        self.symbols = symbols
        self._pending_seen = 0
        self._failed_classes: set = set()  # egglog Values of replacements whose meta is unknown
        self._meta_cache: dict = {}
        self._next_name = 0  # names (`Namer`) are never reused while the e-graph lives

    def run(self, schedule: list[tuple[str, int]]) -> SaturationResult:
        result = SaturationResult({})
        if not schedule:
            return result
        start = time.perf_counter()
        for round_no in range(self.limits.iteration_limit):
            result.rounds = round_no + 1
            changed = False
            for name, iterations in schedule:
                for _ in range(iterations):
                    reason = self._limit_hit(start)
                    if reason:
                        result.stopped_by = reason
                        log.warning("e-graph saturation stopped by the %s after %d round(s); "
                                    "keeping the best graph found so far", reason, result.rounds)
                        return result
                    report = _run(self.egraph, f"(run-schedule (run {name}))")[-1].report
                    _count(result, report)
                    if not report.updated:
                        break
                    changed = True
            accepted = self._accept_pending(result)
            if not changed and not accepted:
                return result
        result.stopped_by = "iteration limit"
        log.warning("e-graph saturation stopped by the iteration limit (%d rounds); keeping the best graph so far",
                    self.limits.iteration_limit)
        return result

    def _limit_hit(self, start: float) -> str | None:
        if time.perf_counter() - start > self.limits.time_limit_s:
            return "time limit"
        if egraph_size(self.egraph) > self.limits.node_limit:
            return "node limit"
        return None

    # -- metas of new e-classes -------------------------------------------------------------
    def _accept_pending(self, result: SaturationResult) -> bool:
        """Infer metas of new replacement terms, then union those whose meta matches."""
        size = _pending_size(self.egraph)
        if size == self._pending_seen:
            return False
        self._pending_seen = size
        functions = self.egraph.freeze().functions  # every table, converted: read it once
        metas = raw_metas(functions)
        if self._unknown_replacements(functions, metas):
            self._infer_replacements(Snapshot(self.egraph, True, functions, metas), result)
        before = egraph_size(self.egraph)
        report = _run(self.egraph, "(run-schedule (saturate (run accept)))")[-1].report
        _count(result, report)
        n = sum(report.num_matches_per_rule.values())
        return bool(n) or egraph_size(self.egraph) != before

    def _unknown_replacements(self, functions, metas: dict) -> bool:
        """Whether some pending replacement has no meta and has not failed inference before (most
        rounds after the first add none, and a snapshot costs a pass over the e-graph)."""
        return any(row.inputs[1] not in metas and row.inputs[1] not in self._failed_classes
                   for row in functions["Pending"].rows)

    def _infer_replacements(self, snap: Snapshot, result: SaturationResult) -> None:
        """Infer and set the metas of pending replacements that have none."""
        found = _Inference(snap, Decoder(snap, self.tables), Namer(snap, self._next_name))
        for matched, replacements in snap.pending().items():
            for cls in replacements:
                if snap.meta_key(cls) is None and snap.values[cls] not in self._failed_classes:
                    meta = self._infer(cls, found)
                    if meta is None:
                        self._failed_classes.add(snap.values[cls])
        self._next_name = found.namer.next
        if found.namer.rows:
            send_rows(self.egraph, found.namer.rows, "(run-schedule (saturate (run name)))")
        for i in range(0, len(found.commands), META_BATCH):
            _run(self.egraph, "".join(found.commands[i:i + META_BATCH]))
        result.metas_inferred += len(found.namer.rows.get("NameMeta", ()))

    def _infer(self, cls, found: "_Inference", depth: int = 0):
        """Meta of e-class ``cls`` (inferring its arguments' metas first); None if unknown."""
        memo, snap, dec = found.memo, found.snap, found.dec
        if cls in memo:
            return memo[cls]
        known = dec.meta(cls)
        if known is not None:
            return known
        memo[cls] = None  # guards against cycles
        if depth > 50:
            return None
        meta = None
        for node in snap.classes.get(cls, []):
            if is_call(node.op):
                meta = self._infer_call(node, found, depth)
            else:
                meta = literal_meta(node, snap)
            if meta is not None:
                break
        memo[cls] = meta
        if meta is not None:
            if not found.namer.can_name(cls):
                return None
            key = self.tables.meta_key(meta)
            if key is not None:
                found.namer.set_meta(cls, key)
                found.commands.extend(describe_commands(self.tables, meta))
        return meta

    def _infer_call(self, node, found: "_Inference", depth: int):
        snap, dec = found.snap, found.dec
        op_name, arg_classes, _stream = dec.call_parts(node)
        try:
            target = target_from_name(op_name)
        except OpError:
            return None

        def value_of(c):
            for n in snap.classes.get(c, []):
                if n.op in VALUE_OPS:
                    return dec.literal(n, value_of)
            m = self._infer(c, found, depth + 1)
            if m is None:
                raise LookupError(c)
            return m

        try:
            values = [value_of(c) for c in arg_classes]
        except (LookupError, KeyError, ValueError):
            return None
        # Repeated layers ask the same question many times: memoize on the metas and literals.
        key = (op_name, tuple(self.tables.meta_key(v) or repr(v) for v in values))
        if key in self._meta_cache:
            return self._meta_cache[key]
        args, kwargs = split_args(target, values)
        try:
            meta = infer_meta(target, args, kwargs, self.symbols)
        except Exception as e:  # an op whose shape we cannot infer is simply not rewritten
            log.debug("e-graph: no meta for a new %s term: %s", op_name, e)
            meta = None
        self._meta_cache[key] = meta
        return meta


@dataclasses.dataclass
class _Inference:
    """One accept step's state: the snapshot, metas found so far, and what sets them in egglog."""

    snap: Snapshot
    dec: Decoder
    namer: Namer
    memo: dict = dataclasses.field(default_factory=dict)
    commands: list = dataclasses.field(default_factory=list)  # analyses of new meta keys


def infer_meta(target, args, kwargs, symbols):
    """The meta of a new term: the shape engine's `infer_meta`."""
    from ..shape import infer_meta as shape_infer

    return shape_infer(target, args, kwargs, symbols)
