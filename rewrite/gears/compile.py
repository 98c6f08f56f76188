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

from ..fx_bridge import argument_path
from ..ir import Graph, TensorMeta
from ..unit import CompileUnit
from .dispatch import GearDispatcher, GearSymbol
from .traffic import function_name, register_symbolic
from .spec import GearError, GearSpec, retrace_at_own_sizes

log = logging.getLogger("rewrite")

__all__ = ["compile_dynamic", "bind_gears", "concretize", "trace_conflicts", "release_op_guards"]

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
                                f"symbol (Dynamo specialized it); gears need the dimension dynamic"
                                + _same_size_hint(graph, spec, size))
            if size not in by_symbol:
                info = graph.symbols.get(size)
                scalar = info.scalar_input_index if info is not None else None
                by_symbol[size] = GearSymbol(size, inp.index, dim, f"input {argument_path(inp.name)} dim {dim}", scalar)
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


def _same_size_hint(graph: Graph, spec: GearSpec, size) -> str:
    """Where a geared dim was specialized because the model ties it to an input of that size that has no gears (a
    model's input_ids and attention_mask over the sequence): name those inputs, since giving them the same gears
    is the fix."""
    geared = {inp.index for inp in spec.inputs}
    found = [f"input {p.name} dim {d}" for i, p in enumerate(graph.placeholders) if i not in geared
             and isinstance(p.meta, TensorMeta) for d, x in enumerate(p.meta.shape) if sympy.sympify(x) == size]
    if not found:
        return ""
    return (f"; an input without gears has that size ({', '.join(found[:4])}) and the model ties the two together: "
            "give it the same gears with set_dim_gears (one gear axis, whichever inputs carry it)")


def trace_conflicts(graph: Graph, gears: list[dict]) -> list[str | None]:
    """Which gears this trace can serve: per gear (``{size symbol: value}``), what of the trace it
    contradicts (a symbol's range, a guard or runtime assert Dynamo recorded while tracing), or None.

    A gear the trace cannot serve runs other code than the traced graph (e.g. the model branched on
    ``size > 1``); Dynamo traces such shapes separately. A gear that contradicts only guards raised
    inside ops (a meta kernel or ATen's backend choice asking ``batch == 1`` or ``batch < 16``: the
    op in the graph is the same whatever the answer) is served when its own shape inference agrees
    with the traced graph at its sizes: those guards are released from Dynamo's shape environment,
    so Dynamo never retraces for it (`release_op_guards`). Outside a Dynamo trace only ranges are known.
    """
    env = _shape_env()
    facts = _shape_facts(env)
    out = []
    for values in gears:
        why = _violated(values, facts, graph.symbols)
        if why is not None and env is not None and release_op_guards(graph, values, env):
            why = None
        out.append(why)
    return out


def release_op_guards(graph: Graph, values: dict, env) -> bool:
    """Serve the gear ``values`` from this trace although it contradicts guards Dynamo recorded, when
    the trace was made at the largest gear (`set_dim_gears`' size hints), every such guard arose inside
    an op (`_inside_an_op`), none is an equality the trace relied on, and the gear's static graph passes shape
    inference (each op's shape at the gear's sizes is the one the trace recorded). Then those guards
    are removed and the symbols' ranges widened to the gear, in Dynamo's environment (read when it
    builds its guards, after the backend returns) and in the graph's. False: nothing changed."""
    from ..shape import ShapeInferenceError, infer_graph

    if any(sym not in env.var_to_hint_override for sym in values):
        return False  # a trace at the call's own sizes (`retrace_at_own_sizes`) is that size's: nothing is released
    guards = [g for g in env.guards if _contradicts(env.replace(g.expr), values)]
    if not all(_inside_an_op(g) and not isinstance(g.expr, sympy.Eq) for g in guards):
        # A guard from the model's code may mean other code; an equality held while tracing (``Eq(1, s)``
        # at a trace of size 1) let Dynamo put its value into the graph's sizes: neither is released.
        return False
    if any(_contradicts(env.replace(a.expr), values) for asserts in env.deferred_runtime_asserts.values()
           for a in asserts):
        return False  # a runtime assert runs in the graph itself: it would fail there
    try:
        infer_graph(concretize(graph, values), check=True)
    except (ShapeInferenceError, GearError) as e:
        log.info("gears: gear %s needs a trace of its own: its shapes differ from the traced graph's (%s)",
                 tuple(values.values()), e)
        return False
    except Exception as e:  # noqa: BLE001 - a meta kernel refusing the gear's sizes: the op's meaning differs
        log.info("gears: gear %s needs a trace of its own: %s: %s", tuple(values.values()), type(e).__name__, e)
        return False
    for g in guards:
        env.guards.remove(g)
        log.info("gears: gear %s served by the same graph: guard %s (raised inside an op at %s) released",
                 tuple(values.values()), g.expr, g.sloc)
    for sym, v in values.items():
        r = env.var_to_range.get(sym)
        if r is not None and not r.lower <= v <= r.upper:
            env.var_to_range[sym] = type(r)(min(r.lower, v), max(r.upper, v))
        info = graph.symbols.get(sym)
        if info is not None:
            info.lower = min(info.lower, v) if info.lower is not None else v
            info.upper = max(info.upper, v) if info.upper is not None else None
    return True


# Where a guard is raised inside an op rather than by the model's own Python: torch's meta kernels,
# decompositions, reference implementations, fake-tensor impls, and ATen ops Dynamo runs on fake
# tensors (their C++ backend choice). A guard raised while Dynamo evaluates the model's code
# (``if x.shape[0] > 3``) is never released: the model may really run other code for other sizes.
_OP_FILES = ("torch/_subclasses/", "torch/_refs/", "torch/_decomp/", "torch/_meta_registrations.py", "torch/_prims/",
             "torch/_prims_common/", "torch/_functorch/")
_OP_FRAMES = {("torch/_dynamo/utils.py", "run_node"), ("torch/_dynamo/utils.py", "get_fake_value")}


def _inside_an_op(guard) -> bool:
    loc = getattr(getattr(guard, "sloc", None), "framework_loc", None)
    filename = getattr(loc, "filename", None)
    if not isinstance(filename, str):
        return False
    filename = filename.replace("\\", "/")
    return any(f in filename for f in _OP_FILES) or any(filename.endswith(f) and loc.name == n for f, n in _OP_FRAMES)


def _contradicts(expr, values: dict) -> bool:
    try:
        return bool(expr.free_symbols & set(values)) and sympy.sympify(expr).subs(values) == sympy.false
    except (TypeError, AttributeError):
        return False


def _forget_speculation() -> None:
    """Let the restarted trace take another path through the model's code than this one did.

    Without ``fullgraph``, Dynamo logs the instructions where it may break the graph and a restarted
    trace must pass the same ones (its ``SpeculationLog``): a trace at the call's own size that goes
    down the other side of the model's ``if x.shape[0] == 1`` failed with SpeculationLogDivergence.
    Dynamo clears the log itself for restarts that change what is traced (``UnspecializeRestartAnalysis``),
    but a backend can only raise ``TensorifyScalarRestartAnalysis``, so it is cleared here. Written for
    torch 2.13 (the root translator's ``speculation_log``); a torch without it keeps the old behaviour."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        InstructionTranslator.current_tx().speculation_log.clear()
    except Exception:  # noqa: BLE001 - see the docstring
        log.debug("gears: could not clear Dynamo's speculation log before the restart", exc_info=True)


def _shape_env():
    ctx = torch._guards.TracingContext.try_get()
    return getattr(getattr(ctx, "fake_mode", None), "shape_env", None)


def _shape_facts(env) -> list:
    """Guards and runtime asserts Dynamo recorded on the size symbols while tracing this graph, each as
    (expression, where the user's code raised it or None)."""
    if env is None:
        return []
    from .graphs import guard_origin

    # in the graph's symbols (Dynamo's replacements applied), with the user's line that raised each guard
    facts = [(env.replace(g.expr), guard_origin(g)) for g in env.guards]
    for asserts in env.deferred_runtime_asserts.values():
        facts.extend((env.replace(a.expr), None) for a in asserts)
    return facts


def _violated(values: dict, facts: list, symbols: dict) -> str | None:
    for sym, v in values.items():
        info = symbols.get(sym)
        if info is not None and (v < info.lower or (info.upper is not None and v > info.upper)):
            return f"{sym} = {v} is outside the traced range [{info.lower}, {info.upper if info.upper is not None else 'oo'}]"
    for fact, origin in facts:
        if _contradicts(fact, values):
            return f"the trace assumed {fact}" + (f" (from {origin})" if origin else "")
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


def compile_dynamic(graph: Graph, gear_spec: GearSpec, unit: CompileUnit, build_static, stages, *,
                    gear_graphs: dict | None = None):
    """Compile a graph with size symbols: one static graph per gear (and the symbolic graph itself
    where the fallback asks for it).

    ``unit`` is the graph's `CompileUnit` (`CompileUnit.detached` for a graph built outside the
    backend, e.g. a loaded export); ``build_static(graph)`` builds one executable; ``stages`` is what
    the driver hands down (`rewrite.pipeline.Stages`): ``optimize_gear(static, key)`` re-optimizes a
    gear's graph, ``dump(graph, stage)`` writes it. ``gear_graphs`` (gear key -> optimized static
    graph) is the compile cache's hook: a gear found there is built as it is (no substitution, no
    optimization); every gear optimized here is added.
    """
    report, number = unit.report, unit.number
    fallback = gear_spec.fallback(unit.config.inference_config.gear_fallback)
    symbols, gears = bind_gears(graph, gear_spec)
    # A first call whose own sizes are no gear is refused by the dispatcher when it runs, not here:
    # raised while compiling, Dynamo would wrap it (BackendCompilerFailed, which `except GearError`
    # misses) and the next call would trace again without the gears, since they live on this call's tensors.
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
    conflicts = trace_conflicts(graph, values_of)
    if gear_spec.example is not None:
        example = tuple(gear_spec.example[(s.input_index, s.dim)] for s in symbols)
        if example in gears and conflicts[gears.index(example)] and retrace_at_own_sizes():
            # Traced at the largest gear, this call's own gear runs other code (the model branches on
            # its size): trace again at this call's sizes; Dynamo keeps the graphs apart by its guards.
            log.info("gears: graph %d: the call's gear %s %s; traced again at its own sizes", number, example,
                     conflicts[gears.index(example)])
            _forget_speculation()
            raise torch._dynamo.exc.TensorifyScalarRestartAnalysis(restart_reason="rewrite gears: trace at own size")
    table: dict = {}
    verbose = logging.INFO if len(gears) >= _PROGRESS_FROM else logging.DEBUG
    with report.stage("gears"):
        statics: dict = {}  # gear key -> its static graph, optimized: every one made before any is built
        for n, (key, values, why) in enumerate(zip(gears, values_of, conflicts), 1):
            if why:
                log.warning("gears: gear %s cannot use graph %d (%s); Dynamo traces such shapes separately",
                            key, number, why)
                report.note(f"gear {key} left out: {why}")
                continue
            t0 = time.perf_counter()
            static = gear_graphs.get(key) if gear_graphs is not None else None
            cached = static is not None
            if not cached:
                static = stages.optimize_gear(concretize(graph, values), key)
                if gear_graphs is not None:
                    gear_graphs[key] = static
            stages.dump(static, "gear")  # static.name carries the gear values
            report.gears[key] = static.op_counts()
            statics[key] = (n, static, cached, time.perf_counter() - t0)
        # The memory all gears will share, predicted before any is built (rewrite.exec.memory.PoolMemory).
        stages.gears_made([static for _, static, _, _ in statics.values()])
        for key, (n, static, cached, seconds) in statics.items():
            t0 = time.perf_counter()
            table[key] = build_static(static)
            log.log(verbose, "gears: graph %d gear %d/%d %s %s in %.2f s", number, n, len(gears), key,
                    "built from the cache" if cached else "compiled", seconds + time.perf_counter() - t0)
    if not table:
        raise GearError(f"graph {number}: every gear contradicts the traced graph; see the warnings above")
    report.note("gear keys are (" + ", ".join(f"{s.symbol}={s.label}" for s in symbols) + ")")
    report.count("gear graphs", len(table))

    dynamic_fn = padder = refusal = None
    skip_tokens = unit.config.inference_config.padded_tokens == "skip"
    if fallback == "dynamic":
        with report.stage("codegen"):
            dynamic_fn = build_static(graph)
    elif fallback in ("pad", "fit"):
        from .padding import plan_padding

        padder, refusal = plan_padding(graph, symbols, list(table), find_masks=skip_tokens)
        if refusal and gear_spec.declared:  # sizes between the gears of a declared range still run: dynamically
            log.info("gears: graph %d: sizes between the declared gears that cannot be padded run the dynamic graph: "
                     "%s", number, refusal)
            with report.stage("codegen"):
                dynamic_fn = build_static(graph)
        elif refusal:
            log.warning("gears: graph %d cannot pad shapes outside the gears: %s", number, refusal)
    regrouper = regroup_refusal = None
    if skip_tokens:
        from .regroup import plan_regroup

        regrouper, regroup_refusal = plan_regroup(padder, symbols, list(table), fallback)
        if regroup_refusal:
            regroup_refusal = f"graph {number}: {regroup_refusal}"
            log.warning("gears: padded_tokens='skip' is not possible, padded tokens are computed: %s", regroup_refusal)
    function = function_name(unit)
    register_symbolic(function, [s.label for s in symbols])
    # fit weighs the symbolic graph against padding and splitting; it is built the first time it wins
    build_dynamic = (lambda: build_static(graph)) if fallback == "fit" and padder is not None else None
    return GearDispatcher(symbols, table, fallback, dynamic_fn, padder, refusal, function=function, ledger=unit.ledger,
                          regrouper=regrouper, regroup_refusal=regroup_refusal, build_dynamic=build_dynamic)
