"""The engine: one graph through egglog, load -> saturate under limits -> DAG-aware extraction -> IR.

`Engine` is an egglog EGraph with the prelude and the rulesets declared (`compile.RuleCompiler` writes
them), cached per thread and ruleset list (`engine_for`); `EGraphRun` is one graph in it, between
``(push)`` and ``(pop)``. `run_egraph` is what the optimizer calls; `equivalent_graphs` extracts many
graphs of one saturation for testing compilers.

Threads and processes. egglog's EGraph is bound to the thread that made it (using or dropping it
on another thread panics), so engines are cached per thread: a compile on any thread uses its own
engine, and no engine object ever crosses threads. egglog also starts a worker thread (rayon) when
it is imported; a process forked after that has the pool's state but not its thread, and any
e-graph work there blocks forever. So egglog is imported only when the first e-graph runs, and in
a process forked after it was imported the e-graph step is skipped with a note (every other pass
still runs; graphs stay correct, just less optimized): fork before the first compile, or start
workers with the 'spawn'/'forkserver' method, to keep the e-graph in the children.
"""
from __future__ import annotations

import logging
import os
import sys
import threading

from ..cost import graph_cost
from ..ir import Graph, is_side_effect, map_nodes
from .encode import RuleCompiler
from .extract import extract, extract_variant
from .load import LOAD_PRELUDE, load_graph
from .names import NAME_PRELUDE
from .rebuild import rebuild
from .saturate import Limits, SaturationResult, Saturator
from .snapshot import Snapshot
from .terms import PRELUDE, Tables

log = logging.getLogger("rewrite")


def _runs(rulesets) -> list:
    """``rulesets`` as (RuleSet, iterations) pairs: a pair as it is (the schedule's count), a RuleSet with
    its own ``iterations``."""
    return [r if isinstance(r, tuple) else (r, r.iterations) for r in rulesets]


class Engine:
    """An egglog EGraph with the prelude and the rulesets declared (declaring ~100 rules costs
    ~0.5 s, so engines are cached per ruleset list and each graph runs between push and pop).
    ``rulesets``: RuleSets, or (RuleSet, iterations) pairs as the optimizer's schedule gives them."""

    def __init__(self, rulesets: list):
        import egglog.bindings as eb  # here, not at import time: see "Threads and processes"

        self.egraph = eb.EGraph()
        self.tables = Tables()
        self.egraph.run_program(*self.egraph.parse_program(PRELUDE))
        self.egraph.run_program(*self.egraph.parse_program(LOAD_PRELUDE))
        self.egraph.run_program(*self.egraph.parse_program(NAME_PRELUDE))
        compiler = RuleCompiler(self.tables)
        self.schedule, bodies = [("facts", 1)], []  # facts first: which ops compute which e-classes
        for rs, iterations in _runs(rulesets):
            if not rs.pattern_rules:
                continue
            name, cmds = compiler.compile_ruleset(rs)
            self.schedule.append((name, iterations))
            bodies.extend(cmds)
        for cmd in compiler.declarations + bodies:
            self.egraph.run_program(*self.egraph.parse_program(cmd))


# Per thread: key -> (the rulesets and rules the key names, engine). An entry holds those
# objects, so none of the ids in its key can be reused by another object while it is cached.
# A thread's engines are dropped with the thread, on that thread.
_per_thread = threading.local()
ENGINES_PER_THREAD = 4
# Set in a child process forked after egglog was imported (its worker thread did not survive).
_engine_unusable: str | None = None


def _engine_key(rulesets: list) -> tuple:
    return tuple((id(rs), rs.name, iterations, tuple(id(r) for r in rs.rules)) for rs, iterations in _runs(rulesets))


def engine_for(rulesets: list) -> Engine:
    """This thread's cached engine for exactly these ruleset objects holding exactly these rules."""
    engines = getattr(_per_thread, "engines", None)
    if engines is None:
        engines = _per_thread.engines = {}
    key = _engine_key(rulesets)
    entry = engines.get(key)
    if entry is None:
        if len(engines) >= ENGINES_PER_THREAD:
            engines.pop(next(iter(engines)))
        keep = [(rs, list(rs.rules)) for rs, _ in _runs(rulesets)]
        entry = engines[key] = (keep, Engine(rulesets))
    return entry[1]


def _after_fork_in_child() -> None:
    global _per_thread, _engine_unusable
    # The forking thread's engines were copied into the child; they must not be used (nor
    # dropped by a later eviction, which would run egglog code): forget them without dropping.
    _leaked.append(_per_thread)
    _per_thread = threading.local()
    if "egglog.bindings" in sys.modules:
        _engine_unusable = ("this process was forked after egglog was loaded, and egglog's worker thread "
                            "does not survive fork(); fork before the first compile, or use the 'spawn' or "
                            "'forkserver' start method, to optimize with the e-graph in child processes")


_leaked: list = []  # engines inherited through fork: never touched, never dropped
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class EGraphRun:
    """One graph in an engine's e-graph, between ``(push)`` and ``(pop)``."""

    def __init__(self, graph: Graph, engine: Engine, limits: Limits):
        self.graph = graph
        self.engine = engine
        self.limits = limits
        self.egraph = engine.egraph
        self.tables = Tables()
        self.tables.atoms = dict(engine.tables.atoms)
        self.schedule = engine.schedule
        self.loaded = None
        self.result: SaturationResult | None = None
        self.snapshot: Snapshot | None = None

    def load(self):
        self.loaded = load_graph(self.egraph, self.tables, self.graph)
        return self.loaded

    def saturate(self) -> SaturationResult:
        self.result = Saturator(self.egraph, self.tables, self.limits, self.graph.symbols).run(self.schedule)
        return self.result

    def roots(self, snap: Snapshot) -> list:
        loaded = self.loaded
        roots = [snap.node_table[k] for k in range(len(loaded.nodes))
                 if loaded.nodes[k].kind == "placeholder" or is_side_effect(loaded.nodes[k])]
        out_ids = set()
        map_nodes(self.graph.outputs, lambda n: out_ids.add(n.id) or n)
        return roots + [snap.node_table[loaded.index[i]] for i in out_ids if i in loaded.index]

    def extract(self) -> Graph:
        snap = self.snapshot = Snapshot(self.egraph)
        choice = extract(snap, self.tables, self.roots(snap))
        return rebuild(snap, self.tables, choice, self.loaded, self.graph)

    def variants(self, picks) -> list[Graph]:
        """One graph per ``(pick, seed)`` of `extract_variant`, from one snapshot of the saturated e-graph."""
        snap = self.snapshot = Snapshot(self.egraph)
        roots = self.roots(snap)
        out = []
        for pick, seed in picks:
            choice, wraps = extract_variant(snap, self.tables, roots, pick, seed)
            out.append(rebuild(snap, self.tables, choice, self.loaded, self.graph, wraps))
        return out


def compile_rulesets(rulesets: list) -> list[str]:
    """The egglog text of the rulesets, declarations first (for tests and for reading what a rule became)."""
    compiler = RuleCompiler(Tables())
    out = []
    for rs in rulesets:
        if rs.pattern_rules:
            out.extend(compiler.compile_ruleset(rs)[1])
    return compiler.declarations + out


def run_egraph(graph: Graph, rulesets: list, limits: Limits, report) -> tuple[Graph, bool]:
    """Optimize ``graph`` with ``rulesets`` (RuleSets, or (RuleSet, iterations) pairs) in an e-graph.

    Returns (graph, changed): the input graph itself on any failure or when the result is not
    cheaper; ``changed`` says whether a rule fired or CSE merged something.
    """
    if _engine_unusable is not None:
        if not any(_engine_unusable in n for n in report.notes):
            log.warning("e-graph skipped for %s: %s", graph.name, _engine_unusable)
            report.note(f"e-graph skipped: {_engine_unusable}")
        return graph, False
    with report.stage("egraph.load"):
        engine = engine_for(rulesets)
    engine.egraph.run_program(*engine.egraph.parse_program("(push)"))
    try:
        return _run(graph, EGraphRun(graph, engine, limits), report)
    finally:
        engine.egraph.run_program(*engine.egraph.parse_program("(pop)"))


def equivalent_graphs(graph: Graph, rulesets: list, limits: Limits, picks) -> tuple[list[Graph], SaturationResult]:
    """Graphs equal in value to ``graph``: saturate it once with ``rulesets``, then extract one graph
    per ``(pick, seed)`` in ``picks`` (`extract_variant`: "cheapest", "costliest", "random").

    Unlike `run_egraph` nothing is kept or compared by cost and errors are raised, not swallowed:
    this is for testing compilers with many forms of one graph (`rewrite.testing.check_backend`).
    Returns the graphs (in the order of ``picks``; duplicates are the caller's to drop) and what
    saturation did.
    """
    if _engine_unusable is not None:
        raise RuntimeError(f"e-graph unavailable: {_engine_unusable}")
    engine = engine_for(rulesets)
    engine.egraph.run_program(*engine.egraph.parse_program("(push)"))
    try:
        run = EGraphRun(graph, engine, limits)
        run.load()
        result = run.saturate()
        return run.variants(list(picks)), result
    finally:
        engine.egraph.run_program(*engine.egraph.parse_program("(pop)"))


def _run(graph: Graph, run: EGraphRun, report) -> tuple[Graph, bool]:
    try:
        with report.stage("egraph.load"):
            loaded = run.load()
        report.count("cse", loaded.cse)
        with report.stage("egraph.saturate"):
            result = run.saturate()
        for rule_name, n in result.fired.items():
            report.count(rule_name, n)
        if result.stopped_by:
            report.note(f"e-graph: saturation stopped by the {result.stopped_by}; best graph so far kept")
        with report.stage("egraph.extract"):
            new = run.extract()
        _check_same_interface(graph, new)
    except Exception as e:  # noqa: BLE001 - the optimizer must never break a graph
        log.warning("e-graph optimization of %s failed (%s: %s); keeping the graph as it was",
                    graph.name, type(e).__name__, e)
        log.debug("e-graph failure", exc_info=True)
        report.note(f"e-graph skipped: {type(e).__name__}: {e}")
        return graph, False
    changed = bool(loaded.cse or result.fired)
    if not changed:
        return graph, False
    before, after = graph_cost(graph), graph_cost(new)
    if after > before * (1 + 1e-9) + 1e-9:
        log.info("e-graph result of %s costs more (%.1f > %.1f); keeping the input", graph.name, after, before)
        report.kept = "the graph as it was: the e-graph's cheapest graph was not cheaper (fired rules unused)"
        return graph, False
    report.kept = ("the e-graph's cheapest graph (the op counts above; a fired rule whose result cost more "
                   "is not in it)")
    return new, True


def _check_same_interface(old: Graph, new: Graph) -> None:
    """Same placeholders (names, order, metas) and output metas, or raise."""
    op, np_ = old.placeholders, new.placeholders
    if [p.name for p in op] != [p.name for p in np_]:
        raise RuntimeError("rebuilt graph changed the placeholders")
    olds, news = [], []
    map_nodes(old.outputs, lambda n: olds.append(n) or n)
    map_nodes(new.outputs, lambda n: news.append(n) or n)
    if len(olds) != len(news):
        # an output became a Python value (a size folded to a literal) only for SymMeta outputs
        raise RuntimeError("rebuilt graph changed the output structure")
    for a, b in zip(olds, news):
        if str(a.meta) != str(b.meta):
            raise RuntimeError(f"output {a.name}: meta {a.meta} became {b.meta}")
