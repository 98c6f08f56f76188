"""Compile once for every gear: the symbolic graph -> one static graph per gear -> a dispatcher.

Dynamo traces the model once with the geared dimensions symbolic; the optimizer runs once on that
symbolic graph. Here each gear's sizes are substituted for the symbols and size arithmetic is
folded to constants (the shape layer's ``substitute`` + ``fold_shape_computations``), the static
graph is re-optimized (fixed sizes allow more folding), and built by the kernel backend. A gear
the trace cannot serve (`trace_conflicts`: it contradicts a guard Dynamo recorded, e.g. the model
branched on ``size > 1``) is left out with a warning: Dynamo will trace such shapes separately.
"""
from __future__ import annotations

import logging
import time

import sympy
import torch

from ..ir import Graph, TensorMeta
from ..report import GraphReport
from ..unit import CompileUnit
from .dispatch import GearDispatcher, GearSymbol, not_a_gear
from .spec import GearError, GearSpec

log = logging.getLogger("rewrite")

__all__ = ["compile_dynamic", "bind_gears", "concretize", "trace_conflicts"]

# Log each gear's compile (with its time) at INFO from this many gears on (fewer: DEBUG).
_PROGRESS_FROM = 2


def bind_gears(graph: Graph, spec: GearSpec) -> tuple[list[GearSymbol], list[tuple]]:
    """The gear symbols of ``graph`` and the gears as tuples of their values (in symbol order).

    Each geared (input, dim) must be a size symbol of the graph. Gears that give one symbol two
    different values (product of two inputs whose sizes the model ties together) are dropped.
    """
    placeholders = graph.placeholders
    by_symbol: dict = {}
    for inp in spec.inputs:
        if inp.index >= len(placeholders) or not isinstance(placeholders[inp.index].meta, TensorMeta):
            raise GearError(f"gears of {inp.name}: graph {graph.name} has no tensor input {inp.index} to attach them "
                            f"to (the traced graph has {len(placeholders)} inputs)")
        shape = placeholders[inp.index].meta.shape
        for dim in sorted(inp.dims):
            size = sympy.sympify(shape[dim])
            if not isinstance(size, sympy.Symbol):
                raise GearError(f"gears of {inp.name} dim {dim}: the traced graph has size {size} there, not a size "
                                f"symbol (Dynamo specialized it); gears need the dimension dynamic")
            if size not in by_symbol:
                info = graph.symbols.get(size)
                scalar = info.scalar_input_index if info is not None else None
                by_symbol[size] = GearSymbol(size, inp.index, dim, f"input {inp.name} dim {dim}", scalar)
    symbols = sorted(by_symbol.values(), key=lambda s: (s.input_index, s.dim))
    position = {s.symbol: k for k, s in enumerate(symbols)}
    gears, seen = [], set()
    for gear in spec.gears:
        values: list = [None] * len(symbols)
        conflict = None
        for (index, dim), v in gear.items():
            sym = sympy.sympify(placeholders[index].meta.shape[dim])
            k = position[sym]
            if values[k] is not None and values[k] != v:
                conflict = f"{symbols[k].label} and input {spec.input(index).name} dim {dim} are the same size " \
                           f"in the graph ({sym}) but the gear gives {values[k]} and {v}"
                break
            values[k] = v
        if conflict:
            log.info("gears: skipping a gear: %s", conflict)
            continue
        key = tuple(values)
        if key not in seen:
            seen.add(key)
            gears.append(key)
    if not gears:
        raise GearError("no gear is consistent with the traced graph: every combination gives one size symbol two "
                        "different values; with the 'product' policy, give tied inputs the same gears")
    return symbols, gears


def trace_conflicts(graph: Graph, gears: list[dict]) -> list[str | None]:
    """Which gears this trace can serve: per gear (``{size symbol: value}``), what of the trace it
    contradicts (a symbol's range, a guard or runtime assert Dynamo recorded while tracing), or None.

    A gear the trace cannot serve runs other code than the traced graph (e.g. the model branched on
    ``size > 1``); Dynamo traces such shapes separately. Outside a Dynamo trace only ranges are known.
    """
    facts = _shape_facts()
    return [_violated(values, facts, graph.symbols) for values in gears]


def _shape_facts() -> list:
    """Guards and runtime asserts Dynamo recorded on the size symbols while tracing this graph."""
    ctx = torch._guards.TracingContext.try_get()
    env = getattr(getattr(ctx, "fake_mode", None), "shape_env", None)
    if env is None:
        return []
    facts = [g.expr for g in getattr(env, "guards", [])]
    for asserts in getattr(env, "deferred_runtime_asserts", {}).values():
        facts.extend(a.expr for a in asserts)
    return facts


def _violated(values: dict, facts: list, symbols: dict) -> str | None:
    for sym, v in values.items():
        info = symbols.get(sym)
        if info is not None and (v < info.lower or (info.upper is not None and v > info.upper)):
            return f"{sym} = {v} is outside the traced range [{info.lower}, {info.upper if info.upper is not None else 'oo'}]"
    for fact in facts:
        try:
            if fact.free_symbols & set(values) and sympy.sympify(fact).subs(values) == sympy.false:
                return f"the trace assumed {fact}"
        except (TypeError, AttributeError):
            continue
    return None


def _input_shape_line(graph: Graph, spec: GearSpec) -> str:
    """Like GE's ``ge.inputShape``: each geared input with -1 in its dynamic dims."""
    parts = []
    for inp in spec.inputs:
        dims = ",".join("-1" if d in inp.dims else str(s) for d, s in enumerate(inp.shape))
        parts.append(f"{inp.name}:{dims}")
    return ";".join(parts)


def _dynamic_dims_line(spec: GearSpec) -> str:
    """Like GE's ``ge.dynamicDims``: one entry per gear, the size of every geared (input, dim) in order."""
    order = [(i.index, d) for i in spec.inputs for d in sorted(i.dims)]
    return ";".join(",".join(str(gear[k]) for k in order) for gear in spec.gears)


def concretize(graph: Graph, values: dict) -> Graph:
    """The static graph of one gear: symbols substituted, size arithmetic folded to constants."""
    from ..shape import fold_shape_computations, substitute

    static = substitute(graph, values)
    fold_shape_computations(static)
    static.prune()
    static.name = f"{graph.name}_" + "_".join(f"{s}_{v}" for s, v in values.items())
    return static


def compile_dynamic(graph: Graph, gear_spec: GearSpec | None, unit: CompileUnit, build_static, *,
                    gear_graphs: dict | None = None):
    """Compile a graph with size symbols: one static graph per gear, else the symbolic graph itself.

    ``unit`` is the graph's `CompileUnit` (`CompileUnit.detached` for a graph built outside the
    backend, e.g. a loaded export); ``build_static(graph)`` builds one executable. ``gear_graphs``
    (gear key -> optimized static graph) is the compile cache's hook: a gear found there is built as
    it is (no substitution, no optimization); every gear optimized here is added.
    """
    report, number = unit.report, unit.number
    if gear_spec is None:
        with report.stage("codegen"):
            return build_static(graph)
    from ..dump import dump_graph

    fallback = unit.config.inference_config.gear_fallback
    symbols, gears = bind_gears(graph, gear_spec)
    if gear_spec.example is not None and fallback == "error":
        example = tuple(gear_spec.example[(s.input_index, s.dim)] for s in symbols)
        if example not in gears:
            # The call being compiled could never run: say so now, before compiling every gear.
            raise not_a_gear(symbols, gears, example, fallback)
    sym_of = {s.symbol: s for s in symbols}
    free = {s for s in graph.free_symbols() if s not in sym_of}
    for s in sorted(free, key=str):
        info = graph.symbols.get(s)
        if info is not None and info.input_index is not None:
            log.info("gears: %s (input %d dim %d) has no gears; it stays dynamic in every gear graph",
                     s, info.input_index, info.dim)
    log.info("graph %d: gears (%s) inputShape = %s", number, gear_spec.policy, _input_shape_line(graph, gear_spec))
    log.info("graph %d: gears dynamicDims = %s; symbols %s", number, _dynamic_dims_line(gear_spec),
             ", ".join(f"{s.symbol}: {s.label}" for s in symbols))

    values_of = [{s.symbol: v for s, v in zip(symbols, key)} for key in gears]
    table: dict = {}
    verbose = logging.INFO if len(gears) >= _PROGRESS_FROM else logging.DEBUG
    with report.stage("gears"):
        for n, (key, values, why) in enumerate(zip(gears, values_of, trace_conflicts(graph, values_of)), 1):
            if why:
                log.warning("gears: gear %s cannot use graph %d (%s); Dynamo traces such shapes separately",
                            key, number, why)
                report.notes.append(f"gear {key} left out: {why}")
                continue
            t0 = time.perf_counter()
            static = gear_graphs.get(key) if gear_graphs is not None else None
            cached = static is not None
            if not cached:
                from ..optimizer import optimize  # here: a load whose gears all come from the cache never imports it

                static = concretize(graph, values)
                static = optimize(static, unit.config, GraphReport(static.name))
                if gear_graphs is not None:
                    gear_graphs[key] = static
            dump_graph(static, unit, "gear")  # static.name carries the gear values
            report.gears[key] = static.op_counts()
            table[key] = build_static(static)
            log.log(verbose, "gears: graph %d gear %d/%d %s %s in %.2f s", number, n, len(gears), key,
                    "built from the cache" if cached else "compiled", time.perf_counter() - t0)
    if not table:
        raise GearError(f"graph {number}: every gear contradicts the traced graph; see the warnings above")
    report.notes.append("gear keys are (" + ", ".join(f"{s.symbol}={s.label}" for s in symbols) + ")")
    report.count("gear graphs", len(table))

    dynamic_fn = padder = refusal = None
    if fallback == "dynamic":
        with report.stage("codegen"):
            dynamic_fn = build_static(graph)
    elif fallback == "pad":
        from .padding import plan_padding

        padder, refusal = plan_padding(graph, symbols)
        if refusal:
            log.warning("gears: graph %d cannot pad shapes outside the gears: %s", number, refusal)
    return GearDispatcher(symbols, table, fallback, dynamic_fn, padder, refusal)
