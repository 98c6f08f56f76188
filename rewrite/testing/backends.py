"""Does a compiler keep the meaning of a graph in every form it may take? `check_backend` asks.

Silent wrong results are the torch.compile bug users fear most, and one graph checked against eager
says little: a compiler's pattern matcher may miss ``add(neg(y), x)`` where it handles
``add(x, neg(y))``, fold ``t(t(x))`` wrongly, or split a merged GEMM badly. PolyJuice (OOPSLA'24)
built equivalent versions of graphs by equality saturation and compared what compilers made of them.
`check_backend` does that with rewrite's own e-graph and rule library, for any torch.compile backend:

1. import: the function's graphs are captured by Dynamo and AOTAutograd as core-ATen FX graphs (a
   module's weights become constants), or with ``dynamic=True`` traced by ``make_fx`` with symbolic
   sizes, so every variant runs at other sizes;
2. variants: each graph is saturated with the rule library (exact rules only by default; with
   ``rules="all"`` the inexact ones too) and several different graphs are extracted from the
   e-graph (`rewrite.testing.variants`): the original, the cheapest, the costliest and random picks;
3. compile and compare: each variant, turned back into a function (`rewrite.fx_bridge.to_fx`), is
   compiled by every backend under test (`rewrite.testing.targets`) and called on inputs drawn by
   hypothesis (NaN, +-inf, -0.0, extreme integers; for dynamic graphs the sizes 0, 1, the traced
   ones and the edges of the gears), and each result, and each input the graph updates, is compared
   with eager on the same variant (within the dtype's tolerance, or bit for bit with
   ``tolerance=None``). Each variant is also compared with the original in eager: with exact rules
   they agree bit for bit, so a difference there is a wrong rule of rewrite's;
4. a disagreement is shrunk to the smallest graph that still shows it (`rewrite.testing.repro`) and
   written as a standalone reproduction script; `check_backend` raises `BackendMismatch` naming the
   variant, the backend, the inputs and the elements that differ, with the script.

Checking a backend::

    from rewrite.testing import check_backend
    report = check_backend(model, x, backend="inductor", variants=4)   # raises BackendMismatch on a bug
    print(report)   # graphs, variants, compiles, runs, seconds

``python -m rewrite check-backend module:function --shapes 4,8 --backend inductor`` does the same from
the command line; `check_graphs` is the campaign form (random graphs, no exception: findings in the
report), which ``make check-backends`` runs.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import time
import traceback
from typing import Callable, Iterable, Sequence

import sympy
import torch
import torch.fx
from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from ..ir import Graph, TensorMeta
from .equivalence import compare_tensors, tolerance as dtype_tolerance, tolerance_option
from .strategies import shrinking_limited_to, tensors
from .targets import Target, target_for
from .variants import Variant, equivalent_variants

__all__ = ["check_backend", "check_graphs", "capture_graphs", "GraphCase", "Finding", "BackendCheckReport",
           "BackendMismatch", "case_from_graph", "case_from_program", "union_case", "random_cases", "DYNAMIC_SIZES"]

DYNAMIC_SIZES = (0, 1, 2)  # sizes every dynamic dimension is also run at (with the traced one and the largest)
MAX_DYNAMIC_SIZE = 9
LISTED = 4  # differing elements named in a finding


class BackendMismatch(AssertionError):
    """A compiled variant disagreed with eager (or crashed where eager ran); ``.report`` holds every finding."""

    def __init__(self, message: str, report: "BackendCheckReport"):
        super().__init__(message)
        self.report = report


# ================================================================================================
# Cases: a graph, its example inputs, which of them are drawn
# ================================================================================================

@dataclasses.dataclass
class GraphCase:
    """One graph to check: the IR graph (weights as constants), an example value per placeholder,
    the placeholders never drawn (weights kept as inputs), whether integer inputs are drawn from the
    example's own values (token ids of a captured model: random ints would index out of range), and
    for a dynamic graph the size each symbol was traced at."""

    name: str
    graph: Graph
    examples: list
    fixed: frozenset = frozenset()
    like_example: bool = False
    symbols: dict = dataclasses.field(default_factory=dict)  # sympy.Symbol -> traced size
    origin: str = ""  # the program or model it came from, for reports
    parts: int = 1  # graphs joined side by side in this one (`union_case`)

    @property
    def dynamic(self) -> bool:
        return bool(self.symbols)

    def shape(self, index: int, sizes: dict) -> tuple[int, ...]:
        meta = self.graph.placeholders[index].meta
        return tuple(int(sympy.sympify(s).subs(sizes)) for s in meta.shape)

    def gear_dims(self, gears: dict) -> list[tuple[int, dict]]:
        """``(input, {dim: gear sizes})`` for every input dimension that is a symbol."""
        out = []
        for i, p in enumerate(self.graph.placeholders):
            if i in self.fixed or not isinstance(p.meta, TensorMeta):
                continue
            dims = {d: list(gears[s]) for d, s in enumerate(p.meta.shape) if s in gears}
            if dims:
                out.append((i, dims))
        return out


def _symbols_of(graph: Graph, examples: Sequence) -> dict:
    out = {}
    for p, ex in zip(graph.placeholders, examples):
        if isinstance(p.meta, TensorMeta) and isinstance(ex, torch.Tensor):
            for s, n in zip(p.meta.shape, ex.shape):
                if isinstance(s, sympy.Symbol):
                    out.setdefault(s, int(n))
    return out


def case_from_graph(graph: Graph, name: str = "graph", seed: int = 0) -> GraphCase:
    """A static IR graph (e.g. drawn by `rewrite.testing.graphs`) with random example inputs."""
    from .strategies import make_tensor

    examples = [make_tensor([int(s) for s in p.meta.shape], p.meta.dtype, seed + i, 0.0)
                for i, p in enumerate(graph.placeholders)]
    return GraphCase(name, graph, examples, origin=str(graph))


def case_from_program(program, name: str = "program") -> GraphCase:
    """A dynamic program (`rewrite.testing.dynamic.programs`) traced with symbolic sizes."""
    from ..fx_bridge import from_fx
    from .dynamic import trace_program
    from .fx_graphs import decomposition_table
    from .strategies import make_tensor

    gm = trace_program(program, decomposition_table("core"))
    graph = from_fx(gm, name)
    examples = [make_tensor(shape, spec.dtype, i, 0.0) for i, (shape, spec) in enumerate(zip(program.shapes(), program.inputs))]
    return GraphCase(name, graph, examples, symbols=_symbols_of(graph, examples), origin=str(program))


def _detached(values) -> list:
    return [v.detach().clone() if isinstance(v, torch.Tensor) else v for v in values]


def capture_graphs(fn, inputs: Sequence, dynamic: bool = False, name: str | None = None) -> tuple[list[GraphCase], list[str]]:
    """The core-ATen graphs of ``fn(*inputs)`` as `GraphCase`s, and notes on graphs left out.

    Static: Dynamo's graphs (what every backend is handed; each graph break is another graph), traced
    to core ATen as AOTAutograd would (functionalized, input updates as ``copy_`` at the tail) under
    ``torch.no_grad()``, a module's parameters and buffers frozen into constants. ``dynamic``:
    ``make_fx(tracing_mode="symbolic")`` of the whole function (one graph; sizes read from the inputs,
    so the graph runs at other sizes; parameters are constants).
    """
    from ..backend import decomposition_table, freeze_weights, is_weight_source
    from ..fx_bridge import dynamo_input_names, from_fx

    base = name or getattr(fn, "__qualname__", None) or type(fn).__name__
    inputs = list(inputs)
    if dynamic:
        from torch.fx.experimental.proxy_tensor import make_fx

        with torch.no_grad():
            gm = make_fx(fn, decomposition_table(), tracing_mode="symbolic")(*_detached(inputs))
        graph = from_fx(gm, base)
        return [GraphCase(base, graph, _detached(inputs), like_example=True, symbols=_symbols_of(graph, inputs),
                          origin=base)], []
    cases: list[GraphCase] = []
    notes: list[str] = []

    def capture(gm, example_inputs):
        names = dynamo_input_names(gm, len(example_inputs))
        weights = [i for i, n in enumerate(names)
                   if is_weight_source(n) or isinstance(example_inputs[i], torch.nn.Parameter)]
        # Weights as they are (frozen into the graph below); inputs copied before the call can change them.
        real = [v.detach() if i in weights else (v.detach().clone() if isinstance(v, torch.Tensor) else v)
                for i, v in enumerate(example_inputs)]

        captured.append((gm, real, weights))
        return gm.forward

    captured: list = []
    with torch.no_grad():
        torch.compile(fn, backend=capture, dynamic=False)(*inputs)
    # AOTAutograd's own steps (functionalization, core-ATen decompositions, input updates as copy_ at the
    # tail), done here, outside Dynamo, rather than through aot_autograd: its tensorify pass may restart
    # Dynamo, and on torch 2.13 the restarted trace drops in-place updates of 0-dim float64 inputs
    # (docs/inductor_findings.md), so the captured graph would not be the function's own.
    from torch.fx.experimental.proxy_tensor import make_fx

    for k, (gm, real, weights) in enumerate(captured):
        label = f"{base}[{k}]"
        if not all(isinstance(v, torch.Tensor) for v in real):
            notes.append(f"{label}: left out (a graph input is not a tensor)")
            continue
        with torch.no_grad():
            aten_gm = make_fx(torch.func.functionalize(gm, remove="mutations_and_views"), decomposition_table(),
                              tracing_mode="fake")(*_detached(real))
        graph = from_fx(aten_gm, label)
        freeze_weights(graph, {i: real[i] for i in weights})
        cases.append(GraphCase(label, graph, real, fixed=frozenset(weights), like_example=True, origin=base))
    if not cases and not notes:
        notes.append(f"{base}: Dynamo captured no graph (nothing to compile)")
    return cases, notes


# ================================================================================================
# Inputs
# ================================================================================================

SHOWN_ELEMENTS = 64  # inputs up to this size are listed in full in a finding


def describe_inputs(inputs, names: Sequence[str]) -> str:
    """One line per input: name, dtype, shape, and every value (small tensors) or a summary."""
    from ..ops import dtype_str

    lines = []
    for i, t in enumerate(inputs):
        name = names[i] if i < len(names) else f"input {i}"
        if not isinstance(t, torch.Tensor):
            lines.append(f"  {name}: {t!r}")
        elif t.numel() <= SHOWN_ELEMENTS:
            lines.append(f"  {name}: {dtype_str(t.dtype)}{list(t.shape)} = {t.tolist()}")
        else:
            summary = ""
            if t.dtype.is_floating_point:
                finite = t[t.isfinite()]
                summary = (f"; {int(t.isnan().sum())} NaN, {int(t.isinf().sum())} inf"
                           + (f", finite in [{finite.min().item():.4g}, {finite.max().item():.4g}]" if finite.numel() else ""))
            elif t.numel():
                summary = f"; in [{t.min().item()}, {t.max().item()}]"
            lines.append(f"  {name}: {dtype_str(t.dtype)}{list(t.shape)} ({t.numel()} elements{summary})")
    return "\n".join(lines)


def _resample(example: torch.Tensor, shape, seed: int) -> torch.Tensor:
    """A tensor of ``shape`` whose elements are drawn from ``example``'s (valid ids stay valid)."""
    gen = torch.Generator().manual_seed(seed)
    flat = example.reshape(-1)
    if flat.numel() == 0:
        return torch.zeros(shape, dtype=example.dtype)
    return flat[torch.randint(0, flat.numel(), tuple(shape), generator=gen)]


@st.composite
def _inputs(draw, case: GraphCase, sizes: dict, specials: bool):
    out = []
    for i, (p, ex) in enumerate(zip(case.graph.placeholders, case.examples)):
        if i in case.fixed or not isinstance(ex, torch.Tensor):
            out.append(ex)
            continue
        shape = case.shape(i, sizes)
        if case.like_example and not ex.dtype.is_floating_point:
            out.append(_resample(ex, shape, draw(st.integers(0, 2**31 - 1))))
        else:
            out.append(draw(tensors(shape, ex.dtype, specials)))
    return out


def _size_choices(case: GraphCase) -> dict:
    """Per symbol: 0, 1, 2, the traced size, one more, and the largest."""
    return {s: sorted({*DYNAMIC_SIZES, n, n + 1, max(MAX_DYNAMIC_SIZE, n)}) for s, n in case.symbols.items()}


def _gears(case: GraphCase) -> dict:
    """Per symbol, the gears a geared target gets: 1, the traced size and the largest (its edges and
    the trace; zip-merged position by position, so every symbol gets three)."""
    return {s: [1, n, max(MAX_DYNAMIC_SIZE, n + 1)] if n > 1 else [1, 2, MAX_DYNAMIC_SIZE]
            for s, n in case.symbols.items()}


# ================================================================================================
# Running and comparing
# ================================================================================================

def _flat(value) -> list:
    return torch.utils._pytree.tree_flatten(value)[0]


def _call(fn, args, prepare=None):
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    if prepare is not None:
        prepare(args)
    with torch.no_grad():
        out = fn(*args)
    return _flat(out), args


_LOW_PRECISION = (torch.float32, torch.float16, torch.bfloat16)
ERROR_FACTOR = 2.0  # a compiled result may be this many times as far from the float64 reference as eager's


def _float64_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` computing in float64: every float dtype named in an argument becomes float64 and float
    constants are widened (inputs are widened by the caller)."""
    graph = torch.fx.Graph()
    env: dict = {}
    wide = lambda a: torch.float64 if a in _LOW_PRECISION else a  # noqa: E731
    for node in gm.graph.nodes:
        new = graph.node_copy(node, lambda n: env[n])
        new.args = torch.fx.node.map_aggregate(new.args, wide)
        new.kwargs = torch.fx.node.map_aggregate(new.kwargs, wide)
        env[node] = new
    out = torch.fx.GraphModule(gm, graph)
    for name, buf in list(out.named_buffers()):
        if buf.dtype in _LOW_PRECISION and "." not in name:
            setattr(out, name, buf.double())
    return out


class _Reference:
    """The float64 reference of one call, computed when a float result first differs: a compiler may
    round differently from eager (a reduction in another order, an intermediate kept in float32),
    and a difference counts only where the compiled value is farther from the exact value than
    `ERROR_FACTOR` times eager's error (plus the tolerance). torch's own Inductor tests judge the
    same way (``same(..., fp64_ref=...)``). Catastrophic cancellation (a float32 sum of +-2**31) is
    then no finding, and a wrong value still is."""

    def __init__(self, module, inputs):
        self.module, self.inputs, self._outs = module, inputs, None

    def outputs(self):
        if self._outs is None:
            try:
                wide = [a.double() if isinstance(a, torch.Tensor) and a.dtype in _LOW_PRECISION else a
                        for a in self.inputs]
                self._outs = _call(_float64_module(self.module), wide)[0]
            except Exception:  # noqa: BLE001 - no reference (an op without float64): plain tolerance
                self._outs = []
        return self._outs


def _compare(e, a, exact: bool, tol, ref: torch.Tensor | None) -> str | None:
    why = compare_tensors(e, a, exact, tol, listed=LISTED)
    if why is None or exact or ref is None or not e.dtype.is_floating_point or not isinstance(a, torch.Tensor) \
            or a.shape != e.shape or a.dtype != e.dtype or ref.shape != e.shape:
        return why
    e64, a64, r = e.detach().double(), a.detach().double(), ref.detach().double()
    rtol, atol = tol or dtype_tolerance(e.dtype)
    bad = ~torch.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True)
    forgiven = r.isfinite() & ~a64.isnan() & ((a64 - r).abs() <= ERROR_FACTOR * (e64 - r).abs() + atol + rtol * r.abs())
    bad &= ~forgiven
    if not bad.any():
        return None
    idx = [tuple(int(i) for i in row) for row in bad.nonzero()[:LISTED]]
    items = "; ".join(f"at {list(i)}: expected {e64[i].item()!r}, got {a64[i].item()!r} (float64 reference "
                      f"{r[i].item()!r})" for i in idx)
    return (f"{int(bad.sum())} of {e.numel()} elements differ beyond rounding (farther from the float64 "
            f"reference than {ERROR_FACTOR:g}x eager's error): {items}")


def _difference(want, got, exact: bool, tol, names, reference: _Reference | None = None) -> tuple[str | None, int | None]:
    """(why they differ or None, the flat output index that differs or None)."""
    (outs_w, args_w), (outs_g, args_g) = want, got
    if len(outs_w) != len(outs_g):
        return f"{len(outs_g)} outputs, expected {len(outs_w)}", None
    for i, (e, a) in enumerate(zip(outs_w, outs_g)):
        if isinstance(e, torch.Tensor):
            why = compare_tensors(e, a, exact, tol, listed=LISTED)
            if why and reference is not None:
                refs = reference.outputs()
                why = _compare(e, a, exact, tol, refs[i] if i < len(refs) and isinstance(refs[i], torch.Tensor)
                               else None)
        else:
            why = None if e == a else f"expected {e!r}, got {a!r}"
        if why:
            return f"output {i}: {why}", i
    for i, (e, a) in enumerate(zip(args_w, args_g)):
        if isinstance(e, torch.Tensor):
            why = compare_tensors(e, a, exact, tol, listed=LISTED)
            if why:
                return f"input {names[i]} after the call (the graph updates it): {why}", None
    return None, None




# ================================================================================================
# Findings and the report
# ================================================================================================

@dataclasses.dataclass
class Finding:
    """A disagreement: which graph, variant and backend, what differed, the shrunk graph and a script."""

    case: str
    variant: str
    target: str
    kind: str  # "mismatch" (a wrong result), "crash" (the compiled variant raised where eager ran),
    #            "variant" (the variant differs from the original in eager: a wrong rule of rewrite's)
    why: str
    inputs: str = ""
    graph: str = ""  # the shrunk graph's FX code
    ops: tuple[int, int] = (0, 0)  # call nodes before and after shrinking
    script: str = ""
    script_path: str | None = None

    def __str__(self):
        head = (f"{self.target} on {self.case} ({self.variant} variant): "
                + {"mismatch": "wrong result", "crash": "raised where eager ran",
                   "variant": "the variant differs from the original in eager (a rule of rewrite's is wrong)"}[self.kind])
        parts = [head, self.why]
        if self.inputs:
            parts.append("inputs:\n" + self.inputs)
        if self.graph:
            parts.append(f"graph ({self.ops[1]} ops, shrunk from {self.ops[0]}):\n{self.graph}")
        if self.script_path:
            parts.append(f"reproduction script: {self.script_path}")
        elif self.script:
            parts.append("reproduction script:\n" + self.script)
        return "\n\n".join(parts)


@dataclasses.dataclass
class BackendCheckReport:
    """What ran: graphs, variants, compiles (variant x backend), runs compared, time; findings."""

    targets: list[str]
    graphs: int = 0  # graphs checked (a case may join several: `union_case`)
    cases: int = 0  # graphs as compiled (joined ones count once)
    variants: int = 0  # variants checked, originals included
    compiles: int = 0
    runs: int = 0  # compiled calls compared with eager
    invalid: int = 0  # drawn inputs eager itself rejected (left out)
    seconds: float = 0.0
    findings: list[Finding] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    per_target: dict = dataclasses.field(default_factory=dict)  # name -> {"compiles", "runs", "findings", "seconds"}

    @property
    def ok(self) -> bool:
        return not self.findings

    def _target(self, name: str) -> dict:
        return self.per_target.setdefault(name, {"compiles": 0, "runs": 0, "findings": 0, "seconds": 0.0})

    def __str__(self):
        status = "ok" if self.ok else f"{len(self.findings)} finding(s)"
        joined = f" in {self.cases} compiled graph(s)" if self.cases != self.graphs else ""
        lines = [f"check_backend: {status}: {self.graphs} graph(s){joined}, {self.variants} variant(s), {self.compiles} compiles "
                 f"by {', '.join(self.targets)}, {self.runs} compiled calls compared with eager, {self.seconds:.1f} s"]
        for name, t in self.per_target.items():
            lines.append(f"  {name}: {t['compiles']} compiles, {t['runs']} calls, {t['findings']} finding(s), "
                         f"{t['seconds']:.1f} s")
        lines += [f"  note: {n}" for n in self.notes[:10]]
        if len(self.notes) > 10:
            lines.append(f"  ({len(self.notes) - 10} more notes)")
        for f in self.findings:
            lines.append("")
            lines.append(str(f))
        return "\n".join(lines)


# ================================================================================================
# The checker
# ================================================================================================



def _run_hypothesis(check, examples: int, seed, shrink: bool, shrink_seconds: float) -> None:
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])
    test = settings(max_examples=examples, deadline=None, database=None, derandomize=seed is None,
                    suppress_health_check=list(HealthCheck), phases=phases, report_multiple_bugs=False,
                    print_blob=False)(given(st.data())(check))
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    with shrinking_limited_to(shrink_seconds):
        test()


RECOMPILE_LIMIT = 64  # sizes 0 and 1 and each drawn size may recompile; past Dynamo's limit (8) it runs eager


def _dynamo_settings():
    """Dynamo's recompile limit raised while a target is checked: a function that hits the limit
    runs in eager from then on, which would check nothing."""
    import torch._dynamo.config as dynamo_config

    names = {name: RECOMPILE_LIMIT for name in ("recompile_limit", "cache_size_limit") if hasattr(dynamo_config, name)}
    if hasattr(dynamo_config, "accumulated_recompile_limit"):
        names["accumulated_recompile_limit"] = max(dynamo_config.accumulated_recompile_limit, 8 * RECOMPILE_LIMIT)
    return dynamo_config.patch(**names)


@dataclasses.dataclass
class _Options:
    examples: int
    exact: bool
    tol: tuple | None
    specials: bool
    seed: int | None
    shrink: bool
    shrink_seconds: float
    repro_dir: str | None
    rules: str


def _module(graph: Graph) -> torch.fx.GraphModule:
    from ..fx_bridge import to_fx

    return to_fx(graph)


def _fresh(module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy with its own code object: Dynamo caches compiled code per code object, and a second
    backend compiling the same module would get the first one's code back when its guards pass
    (the same backend under another setting: ``dynamic=True``, freezing)."""
    return torch.fx.GraphModule(module, copy.deepcopy(module.graph))


def _tol_for(case: GraphCase, opts: _Options) -> tuple[float, float]:
    if opts.tol is not None:
        return opts.tol
    dtypes = [p.meta.dtype for p in case.graph.placeholders if isinstance(p.meta, TensorMeta)]
    floats = [d for d in dtypes if d.is_floating_point] or [torch.float32]
    return max((dtype_tolerance(d) for d in floats), key=lambda t: t[0])


def _names(case: GraphCase) -> list[str]:
    return [p.name for p in case.graph.placeholders]


def _check_variant_value(case: GraphCase, variant: Variant, original, module, opts: _Options,
                         report: BackendCheckReport) -> Finding | None:
    """The variant in eager against the original in eager: equal bit for bit (exact rules), or within
    tolerance on inputs in an inexact rule's domain."""
    from ..dsl import in_domain

    exact = opts.rules == "exact"
    names = _names(case)
    found: dict = {}
    sizes_for = _size_choices(case)

    def check(data):
        sizes = {s: data.draw(st.sampled_from(v)) for s, v in sizes_for.items()}
        inputs = data.draw(_inputs(case, sizes, opts.specials and exact), label="inputs")
        if not exact and not in_domain(dict(enumerate(inputs))):
            reject()
        try:
            want = _call(original, inputs)
        except Exception:  # noqa: BLE001 - the graph is not valid at these sizes
            report.invalid += 1
            reject()
        try:
            got = _call(module, inputs)
        except Exception as e:  # noqa: BLE001
            found.update(why=f"the variant raised {type(e).__name__} in eager: {e}", inputs=inputs, sizes=sizes)
            raise AssertionError(found["why"]) from None
        why, _ = _difference(want, got, exact, None, names)
        if why:
            found.update(why=why, inputs=inputs, sizes=sizes)
            raise AssertionError(why)

    try:
        _run_hypothesis(check, max(2, opts.examples // 2), opts.seed, opts.shrink, opts.shrink_seconds)
    except Unsatisfiable:
        return None
    except AssertionError:
        return Finding(case.name, variant.label, "eager", "variant", found.get("why", "?"),
                       describe_inputs(found.get("inputs", []), names), graph=module.code.strip(),
                       ops=(variant.graph.num_ops(), variant.graph.num_ops()))
    return None


def _check_target(case: GraphCase, variant: Variant, module, target: Target, opts: _Options,
                  report: BackendCheckReport) -> Finding | None:
    """Compile ``module`` with ``target`` and compare it with eager on drawn inputs."""
    t0 = time.perf_counter()
    try:
        return _check_target_timed(case, variant, module, target, opts, report)
    finally:
        report._target(target.name)["seconds"] += time.perf_counter() - t0


def _check_target_timed(case: GraphCase, variant: Variant, module, target: Target, opts: _Options,
                        report: BackendCheckReport) -> Finding | None:
    names = _names(case)
    gears = _gears(case) if target.gears else None
    gear_dims = case.gear_dims(gears) if gears else []
    tol = _tol_for(case, opts)
    stats = report._target(target.name)
    found: dict = {}
    history: list = []  # the inputs of every call made so far (a compiled function keeps state)
    with target.context(), _dynamo_settings():
        compiled = target.compile(_fresh(module), case.dynamic)
        stats["compiles"] += 1
        report.compiles += 1
        first = [True]

        def prepare(args):
            if first[0] and gear_dims:
                from ..gears.spec import set_dim_gears

                for i, dims in gear_dims:
                    set_dim_gears(args[i], dims)
            first[0] = False

        def run_one(inputs, sizes):
            try:
                want = _call(module, inputs)
            except Exception:  # noqa: BLE001 - eager rejects these inputs: not the backend's business
                report.invalid += 1
                return "invalid"
            for _ in range(target.calls):
                history.append(inputs)
                try:
                    got = _call(compiled, inputs, prepare)
                except Exception as e:  # noqa: BLE001 - a crash where eager ran is a finding too
                    found.update(kind="crash", why=f"the compiled variant raised {type(e).__name__}: {e}",
                                 detail="".join(traceback.format_exception(e))[-3000:], inputs=inputs, sizes=sizes,
                                 output=None, calls=list(history))
                    return found["why"]
                stats["runs"] += 1
                report.runs += 1
                why, output = _difference(want, got, opts.exact, tol, names, _Reference(module, inputs))
                if why:
                    found.update(kind="mismatch", why=why, inputs=inputs, sizes=sizes, output=output,
                                 calls=list(history))
                    return why
            return None

        # The example inputs first (at the traced sizes): a geared target gets its gears on this call.
        traced = dict(case.symbols)
        first_why = run_one(list(case.examples), traced)
        if first_why == "invalid":
            report.notes.append(f"{case.name}: eager rejected the example inputs of the {variant.label} variant")
            return None
        if not first_why:
            sizes_for = ({s: sorted(set(g)) for s, g in gears.items()} if gears else _size_choices(case))

            def check(data):
                if gears:
                    k = data.draw(st.integers(0, 2), label="gear")
                    sizes = {s: g[k] for s, g in gears.items()}
                else:
                    sizes = {s: data.draw(st.sampled_from(v)) for s, v in sizes_for.items()}
                inputs = data.draw(_inputs(case, sizes, opts.specials), label="inputs")
                why = run_one(inputs, sizes)
                if why == "invalid":
                    reject()
                if why:
                    raise AssertionError(why)

            try:
                _run_hypothesis(check, opts.examples, opts.seed, opts.shrink, opts.shrink_seconds)
            except Unsatisfiable:
                report.notes.append(f"{case.name} ({variant.label}): eager rejected every drawn input")
            except AssertionError:
                pass
    if not found:
        return None
    return _finding(case, variant, module, target, opts, found, gear_dims)


def _still_fails(target: Target, kind: str, exact: bool, tol, gear_dims, dynamic: bool):
    """The shrinker's test: a fresh compile of the candidate disagrees with eager (or crashes)."""
    def test(gm: torch.fx.GraphModule, calls: list[list]) -> bool:
        with target.context(), _dynamo_settings():
            compiled = target.compile(gm, dynamic)
            first = [True]

            def prepare(args):
                if first[0] and gear_dims:
                    from ..gears.spec import set_dim_gears

                    for i, dims in gear_dims:
                        if i < len(args):
                            set_dim_gears(args[i], dims)
                first[0] = False

            names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
            for args in calls:
                want = _call(gm, args)
                try:
                    got = _call(compiled, args, prepare)
                except Exception as e:  # noqa: BLE001
                    if kind == "crash":
                        return f"the compiled graph raised {type(e).__name__}: {e}"
                    raise
                if kind == "mismatch":
                    why = _difference(want, got, exact, tol, names, _Reference(gm, args))[0]
                    if why:
                        return why
        return None
    return test


def _finding(case: GraphCase, variant: Variant, module, target: Target, opts: _Options, found: dict,
             gear_dims) -> Finding:
    from .repro import drop_unused_inputs, repro_script, shrink_graph

    tol = _tol_for(case, opts)
    calls = [list(c) for c in found["calls"]]
    ops_before = sum(1 for n in module.graph.nodes if n.op == "call_function")
    gm, tried = module, 0
    if opts.shrink:
        test = _still_fails(target, found["kind"], opts.exact, tol, gear_dims, case.dynamic)
        # The fewest calls that still show it on a fresh compile: the failing input alone (as often as
        # the target is called per input), after the example call, or every call made.
        failing = [list(found["inputs"])] * target.calls
        for candidate in (failing, [list(case.examples)] + failing):
            if len(candidate) < len(calls) and test(module, candidate):
                calls = candidate
                break
        try:
            gm, calls, tried = shrink_graph(module, calls, found.get("output"), test, opts.shrink_seconds)
        except Exception as e:  # noqa: BLE001 - the unshrunk graph is still a finding
            gm = module
            found["why"] += f"\n(shrinking failed: {type(e).__name__}: {e})"
        if gm is not module:  # say what differs on the graph that is left
            try:
                now = test(gm, calls)
            except Exception:  # noqa: BLE001
                now = None
            if now:
                found["why"] = f"{now}\n(on the graph before shrinking: {found['why']})"
    gm, calls, kept = drop_unused_inputs(gm, calls)
    gear_dims = [(kept.index(i), dims) for i, dims in gear_dims if i in kept]
    ops_after = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    title = (f"{target.name} disagrees with eager on a {variant.label} variant of {case.name}: "
             f"{found['why'].splitlines()[0][:200]}")
    script = repro_script(gm, calls, target.repro(case.dynamic), title=title, exact=opts.exact, tol=tol,
                          gears=[(i, dims) for i, dims in gear_dims if calls and i < len(calls[0])])
    path = None
    if opts.repro_dir:
        os.makedirs(opts.repro_dir, exist_ok=True)
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in f"{target.name}_{case.name}_{variant.label}")
        path = os.path.join(opts.repro_dir, f"repro_{safe}.py")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(script)
        os.replace(tmp, path)
    why = found["why"]
    if found.get("detail"):
        why += "\n" + found["detail"]
    sizes = found.get("sizes") or {}
    if case.dynamic and sizes:
        why += "\nsizes: " + ", ".join(f"{s} = {v}" for s, v in sizes.items())
    shown = calls[-1] if calls else found["inputs"]
    shown_names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    return Finding(case.name, variant.label, target.name, found["kind"], why, describe_inputs(shown, shown_names),
                   gm.code.strip(), (ops_before, ops_after), script, path)


def _check_case(case: GraphCase, targets: list[Target], opts: _Options, report: BackendCheckReport,
                variants: int, variant_seed: int) -> None:
    report.graphs += case.parts
    report.cases += 1
    try:
        found, note = equivalent_variants(case.graph, variants, opts.rules, seed=variant_seed)
    except Exception as e:  # noqa: BLE001 - the original alone still checks the backend
        found, note = [Variant("original", case.graph)], f"no variants: the e-graph failed ({type(e).__name__}: {e})"
    report.notes.append(f"{case.name}: {note}")
    original = _module(case.graph)
    failed_original: set[str] = set()
    for variant in found:
        report.variants += 1
        try:
            module = original if variant.label == "original" else _module(variant.graph)
        except Exception as e:  # noqa: BLE001
            report.notes.append(f"{case.name} ({variant.label}): cannot be turned back into FX: {e}")
            continue
        if variant.label != "original":
            finding = _check_variant_value(case, variant, original, module, opts, report)
            if finding is not None:
                report.findings.append(finding)
                continue
        for target in targets:
            if target.dynamic_only and not case.dynamic:
                continue
            if target.name in failed_original:
                continue  # the graph as written fails already: its other forms would repeat the finding
            finding = _check_target(case, variant, module, target, opts, report)
            if finding is not None:
                report.findings.append(finding)
                report._target(target.name)["findings"] += 1
                if variant.label == "original":
                    failed_original.add(target.name)
                    report.notes.append(f"{case.name}: {target.name} fails on the original graph; its variants "
                                        "are not checked with it")


def _targets(backend) -> list[Target]:
    items = backend if isinstance(backend, (list, tuple)) else [backend]
    if not items:
        raise ValueError("backend: name at least one backend to check")
    return [target_for(b) for b in items]


def _options(examples, tolerance, specials, seed, shrink, shrink_seconds, repro_dir, rules) -> _Options:
    if examples < 1:
        raise ValueError(f"examples={examples} must be at least 1")
    exact, tol = tolerance_option(tolerance)
    return _Options(examples, exact, tol, specials, seed, shrink, shrink_seconds, repro_dir, rules)


def check_backend(fn, *inputs, backend="inductor", variants: int = 4, rules: str = "exact", examples: int = 10,
                  dynamic: bool = False, tolerance="dtype", specials: bool = True, seed: int | None = None,
                  shrink: bool = True, shrink_seconds: float = 60.0, repro_dir: str | None = None,
                  raise_on_failure: bool = True) -> BackendCheckReport:
    """Check that ``backend`` computes what eager computes for equivalent forms of ``fn``'s graphs.

    ``fn``: a function of tensors or an ``nn.Module``, called as ``fn(*inputs)``. ``backend``: a
    name in `rewrite.testing.TARGETS` (``"inductor"``, ``"inductor-dynamic"``, ``"inductor-freezing"``,
    ``"rewrite"`` past its tier-up, ``"rewrite-reduce-overhead"``, ``"rewrite-dynamic"``,
    ``"rewrite-gears"``, ``"eager"``), any backend ``torch.compile`` takes (a string or a callable),
    a `Target`, or a list of them. ``variants``: extraction picks per graph (the cheapest, the
    costliest, then random ones; duplicates dropped; the original is always checked too).
    ``rules``: ``"exact"`` or ``"all"`` (inexact rules too). ``examples``: input draws per variant and
    backend, after the given inputs. ``dynamic``: trace with symbolic sizes and run every variant at
    sizes 0, 1, 2, the traced ones and the largest (geared targets: at their gears).
    ``tolerance``: ``"dtype"`` (per-dtype defaults), None (bit for bit) or ``(rtol, atol)``.
    ``specials``: season drawn inputs with NaN/inf/-0.0/extremes. ``seed``: vary the draws (the
    default draws the same every run). A disagreement is shrunk for about ``shrink_seconds`` and a
    reproduction script written to ``repro_dir`` (when given) or printed.

    Raises `BackendMismatch` (an AssertionError) listing the findings, unless ``raise_on_failure``
    is False; returns a `BackendCheckReport`.
    """
    opts = _options(examples, tolerance, specials, seed, shrink, shrink_seconds, repro_dir, rules)
    targets = _targets(backend)
    report = BackendCheckReport([t.name for t in targets])
    start = time.perf_counter()
    try:
        cases, notes = capture_graphs(fn, inputs, dynamic=dynamic)
        report.notes.extend(notes)
        for case in cases:
            _check_case(case, targets, opts, report, variants, seed or 0)
    finally:
        for t in targets:
            t.cleanup()
    report.seconds = time.perf_counter() - start
    if report.findings and raise_on_failure:
        raise BackendMismatch(str(report), report)
    return report


def check_graphs(cases: Iterable[GraphCase], backend="inductor", *, variants: int = 3, rules: str = "exact",
                 examples: int = 5, tolerance="dtype", specials: bool = True, seed: int | None = None,
                 shrink: bool = True, shrink_seconds: float = 60.0, repro_dir: str | None = None,
                 report: BackendCheckReport | None = None, on_case: Callable | None = None) -> BackendCheckReport:
    """`check_backend` for graphs one has already (random graphs, a model zoo's captured graphs):
    each `GraphCase` with its variants through every backend; findings are collected, not raised.
    ``on_case(case, report)`` is called after each case (progress)."""
    opts = _options(examples, tolerance, specials, seed, shrink, shrink_seconds, repro_dir, rules)
    targets = _targets(backend)
    report = report or BackendCheckReport([t.name for t in targets])
    start = time.perf_counter()
    try:
        for k, case in enumerate(cases):
            _check_case(case, targets, opts, report, variants, (seed or 0) * 100_003 + k)
            if on_case is not None:
                on_case(case, report)
    finally:
        for t in targets:
            t.cleanup()
    report.seconds += time.perf_counter() - start
    return report


def union_case(cases: Sequence[GraphCase], name: str = "union") -> GraphCase:
    """Static cases side by side in one graph: placeholders of every case first (renamed ``g<k>_...``),
    then their computations, then every input update (functional graphs update inputs only at their
    tail), returning every case's outputs. One compile then checks several graphs: a campaign's
    compile time is mostly fixed cost per compile (a C++ build for Inductor), and a finding is shrunk
    to the graph part that shows it anyway."""
    from ..ir import map_nodes
    from ..ops import is_mutable

    if any(c.dynamic for c in cases):
        raise ValueError("union_case: static cases only (symbol names of separately traced graphs collide)")
    graph = Graph(name)
    placeholders, body, updates, outputs = [], [], [], []
    examples, fixed, origins = [], set(), []
    for k, case in enumerate(cases):
        copy, _ = case.graph.copy_with_map()
        for n in copy.nodes:
            if n.kind == "output":
                map_nodes(n.args[0], lambda x: outputs.append(x) or x)
                continue
            n.name = f"g{k}_{n.name}"
            if n.kind == "placeholder":
                n.attrs["name"] = n.name
                placeholders.append(n)
            elif n.kind == "call" and is_mutable(n.target):
                updates.append(n)
            else:
                body.append(n)
        fixed.update(len(examples) + i for i in case.fixed)
        examples.extend(case.examples)
        origins.append(f"# graph g{k} ({case.name}):\n{case.origin}")
    for n in placeholders + body + updates:
        graph.add(n)
    graph.set_output(tuple(outputs))
    graph.validate()
    return GraphCase(name, graph, examples, frozenset(fixed), any(c.like_example for c in cases),
                     origin="\n".join(origins), parts=sum(c.parts for c in cases))


def random_cases(count: int, *, dynamic: bool = False, batch: int = 1, seed: int = 0, max_ops: int = 8):
    """``count`` random graphs as cases (lazily): static graphs drawn by `rewrite.testing.graphs`
    (``batch`` of them side by side per case, `union_case`) or, with ``dynamic``, programs with
    symbolic sizes (`rewrite.testing.dynamic.programs`). Draws are the same for the same ``seed``."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from .dynamic import programs
    from .strategies import graphs

    if count < 1 or batch < 1:
        raise ValueError(f"count={count} and batch={batch} must be at least 1")
    drawn: list = []

    @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.generate], derandomize=False)
    @given(programs(max_ops=max_ops) if dynamic else graphs(max_ops=max_ops))
    def draw(value):
        drawn.append(value)

    hypothesis_seed(seed)(draw)()
    if dynamic:
        for k, program in enumerate(drawn):
            yield case_from_program(program, f"program{seed}-{k}")
        return
    cases = [case_from_graph(g, f"graph{seed}-{k}", seed=k) for k, g in enumerate(drawn)]
    for k in range(0, len(cases), batch):
        part = cases[k:k + batch]
        yield part[0] if len(part) == 1 else union_case(part, f"graphs{seed}-{k}..{k + len(part) - 1}")
