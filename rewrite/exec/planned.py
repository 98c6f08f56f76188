"""Running a static graph under its execution plan (reduce-overhead mode).

The per-call function is generated from the plan like `codegen`'s straight-line code, minus
everything the plan fixed: views of planned buffers and of constants are made once per arena (a
binding) and reach the function as one tuple it unpacks into locals; ``out=`` steps write into
those buffers; a run of consecutive static-kernel steps is one call of the kernels' runner over a
table of pointers that already holds every fixed address, so only the addresses of per-call
values are written into it per call.

A call leases an arena from the function's `ArenaPool` (one per concurrent caller), takes that
arena's binding for this plan (made on first use), runs, and hands the arena back. What the
caller receives is never arena memory (see `rewrite.exec.plan`).

Static kernels bake in strides. When a plan has them, the strides of the inputs that reach them
are checked per call (except at dims of size 1, where no address uses them); other strides run the
graph's plain generated code (logged once), which is always correct.
"""
from __future__ import annotations

import ctypes
import linecache
import logging
import re

import torch

from .. import ops
from ..ir import Graph, Node, TensorMeta, map_nodes
from .codegen import Emitter, compile_graph_to_python, safe_name
from .memory import ArenaPool
from .plan import ExecutionPlan, out_variant

log = logging.getLogger("rewrite")

__all__ = ["PlannedExecutable", "NativeRuns"]


class NativeRuns:
    """How static-kernel steps are bound and run; `rewrite.kernels` provides the real one.

    ``bind(key, node, reads)`` returns ``(function address, operands)``; ``reads``: the nodes a fused
    kernel reads (None: the node's own operands). Each operand is ``("in", Node)``
    (a value of the graph), ``("out", k)`` (the node's k-th output) or ``("tensor", t)`` (memory
    the kernel reads that the plan keeps alive, e.g. packed weights). ``runner`` is the C function
    that runs a table of steps; ``error(code, nodes)`` raises the error a failed step reports.
    """

    runner = None

    def bind(self, key: str, node: Node, reads: list | None = None):
        raise NotImplementedError

    def error(self, code: int, nodes: list):
        raise RuntimeError(f"static kernel failed with code {code}")


class _Run:
    """Consecutive static-kernel steps run by one call, and their table of pointers."""

    def __init__(self, number: int):
        self.number = number
        self.steps: list[int] = []  # node indices
        self.template: list = []  # per table slot: an int, ("value", node index, k), ("tensor", t) or None
        self.per_call: list[tuple[int, str]] = []  # (table slot, Python name of a tensor)


class PlannedExecutable:
    """The callable of one static graph under its plan; all gears of a function share ``pool``."""

    def __init__(self, graph: Graph, plan: ExecutionPlan, pool: ArenaPool, native: NativeRuns | None = None,
                 fallback=None, ledger=None):
        self.graph = graph
        self.plan = plan
        self.pool = pool
        self.native = native
        pool.require(plan.arena_bytes)
        self._warned = False
        self.ledger = ledger  # rewrite.ledger.Ledger: calls that cannot use the static kernels are counted there
        self._index = {n.id: i for i, n in enumerate(graph.nodes)}
        self._fixed = self._fixed_values()
        self._unpacked: list[int] = []  # node indices the per-call function takes from the binding
        self._runs: list[_Run] = []
        self.fallback = fallback or compile_graph_to_python(graph)  # the graph's plain code
        self.source, self._fn = self._generate()

    def __call__(self, *args):
        pool = self.pool
        arena = pool.acquire()
        try:
            fixed, tables = self._binding(arena)
            return self._fn(fixed, tables, *args)
        finally:
            pool.release(arena)

    # -- which values are fixed -------------------------------------------------------------------
    def _fixed_values(self) -> set:
        """Node indices whose value is the same object in every call of one arena."""
        out: set[int] = set()
        for i, n in enumerate(self.graph.nodes):
            p = self.plan.nodes.get(i)
            if n.kind == "constant":
                out.add(i)
            elif p is None:
                continue
            elif p.kind == "fixed" or (p.kind in ("out", "native") and all(b is not None for b in p.buffers)):
                out.add(i)
            elif p.kind == "alias" and p.alias_of in out:
                out.add(i)
        return out

    # -- binding: what one arena holds for this plan -----------------------------------------------
    def _binding(self, arena):
        binding = arena.bindings.get(self)
        if binding is None:  # an arena is leased to one call at a time: no other thread touches it now
            binding = arena.bindings[self] = self._make_binding(arena)
        return binding

    def _make_binding(self, arena):
        g, plan = self.graph, self.plan
        values: dict[int, object] = {}
        for i, n in enumerate(g.nodes):
            p = plan.nodes.get(i)
            if n.kind == "constant":
                values[i] = n.value
            elif p is None:
                continue
            elif p.kind in ("out", "native"):
                views = [None if b is None else arena.view(plan.buffers[b].offset, plan.buffers[b].layout)
                         for b in p.buffers]
                values[i] = tuple(views) if isinstance(n.meta, tuple) else views[0]
            elif p.kind == "alias" and p.alias_of in values:
                values[i] = values[p.alias_of]
            elif p.kind == "fixed":
                get = lambda m: values[self._index[m.id]]  # noqa: E731
                values[i] = n.target(*map_nodes(n.args, get), **map_nodes(n.kwargs, get))
        fixed = tuple(values[i] for i in self._unpacked)
        tables = []
        for run in self._runs:
            entries = []
            for e in run.template:
                if e is None:
                    entries.append(0)
                elif isinstance(e, tuple) and e[0] == "value":
                    v = values[e[1]]
                    entries.append((v[e[2]] if isinstance(v, tuple) else v).data_ptr())
                elif isinstance(e, tuple):
                    entries.append(e[1].data_ptr())
                else:
                    entries.append(e)
            tables.append((ctypes.c_void_p * len(entries))(*entries))
        # Tensors the tables point into stay alive with the binding.
        return fixed, _Tables(tables, values)

    # -- the per-call function ----------------------------------------------------------------------
    def _generate(self):
        g, plan = self.graph, self.plan
        em = Emitter(g, compile_graph_to_python)
        names: dict[int, str] = {}
        for k, p in enumerate(g.placeholders):
            names[p.id] = f"a{k}"
        for n in g.nodes:
            if n.kind == "constant":
                names[n.id] = em.render(n.value)
        em.names = names
        body: list[str] = []
        guards: set[int] = set()
        run: _Run | None = None
        elided = self._elided_views()
        for i, n in enumerate(g.nodes):
            p = plan.nodes.get(i)
            if n.kind != "call":
                continue
            if i in self._fixed:
                names[n.id] = f"f{i}"
            if p.kind == "fused":  # computed inside its group's kernel, at the group's last step
                continue
            if p.kind in ("fixed", "alias"):
                if i not in self._fixed:  # an alias of a per-call value
                    names[n.id] = names[g.nodes[p.alias_of].id]
                continue
            if i in elided:  # its static-kernel readers take its base's address (see _elided_views)
                names[n.id] = names[n.args[0].id]
                continue
            if p.kind == "native":
                if run is None:
                    run = _Run(len(self._runs))
                    self._runs.append(run)
                body.extend(self._emit_native(run, i, n, names, em, guards))
                continue
            if run is not None:
                body.extend(self._close_run(run, em))
                run = None
            if p.kind == "out":
                body.append(self._out_call(i, n, em))
            else:
                names[n.id] = f"v{i}"
                body.append(f"v{i} = {em.call_expr(n)}")
        if run is not None:
            body.extend(self._close_run(run, em))
        returned = f"return {self._outputs(em)}"
        body = _drop_dead(body, keep=set(_VALUE.findall(returned))) + [returned]
        used = sorted({int(m) for m in re.findall(r"\bf(\d+)\b", "\n".join(body))})
        self._unpacked = used
        params = [f"a{k}" for k in range(len(g.placeholders))]
        lines = [f"if a{k}.stride() != {tuple(plan.inputs[k].stride)!r} and not _SAME_LAYOUT(a{k}, "
                 f"{tuple(plan.inputs[k].stride)!r}): return _FALLBACK({', '.join(params)})" for k in sorted(guards)]
        if used:
            lines.append(", ".join(f"f{i}" for i in used) + ", = F")
        lines += body
        fname = safe_name(g.name)
        src = f"def {fname}(F, T, {', '.join(params)}):\n" + "".join(f"    {ln}\n" for ln in lines)
        em.globals.update(_FALLBACK=self._fallback, _SAME_LAYOUT=_same_layout, _empty_strided=torch.empty_strided,
                          _NATIVE_ERROR=self._native_error)
        filename = f"<rewrite-planned-{safe_name(g.name)}-{id(self):x}>"
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        exec(compile(src, filename, "exec"), em.globals)
        return src, em.globals[fname]

    def _elided_views(self) -> set:
        """Per-call views read by static kernels only, that need not be made at all.

        A weight transposed for a GEMM (``mm(x, permute(w))``: the default mode without frozen weights)
        is a per-call op, so it costs an ATen call and splits the run of kernels around it in two.
        A static kernel only needs the address of its operand and bakes in its strides; for these views
        the address is their base's (the storage offset stays), and their layout follows from the
        base's, which `_inputs_reaching` guards per call. So no tensor is made: the kernels read the
        base's address."""
        g, plan = self.graph, self.plan
        readers = g.users()  # the output node reads the outputs, and is no static-kernel step

        def native(m: Node) -> bool:
            p = plan.nodes.get(self._index[m.id])
            return p is not None and p.kind in ("native", "fused")

        out = set()
        for i, n in enumerate(g.nodes):
            p = plan.nodes.get(i)
            if p is None or p.kind != "call" or i in self._fixed or n.target not in _SAME_ADDRESS_VIEWS \
                    or not n.args or not isinstance(n.args[0], Node) or n.waits:
                continue
            users = readers.get(n.id, [])
            if users and all(native(m) for m in users):
                out.add(i)
        return out

    def _out_call(self, i: int, n: Node, em) -> str:
        op, out_names = out_variant(n.target, _device_type(self.graph))
        fn = em.bind(op._op, safe_name(n.op) + "_out_")
        args = [em.render(a) for a in n.args] + [f"{k}={em.render(v)}" for k, v in n.kwargs.items()]
        if len(out_names) == 1:
            args.append(f"{out_names[0]}=f{i}")
        else:
            args += [f"{name}=f{i}[{k}]" for k, name in enumerate(out_names)]
        return f"{fn}({', '.join(args)})"

    def _emit_native(self, run: _Run, i: int, n: Node, names: dict, em, guards: set) -> list:
        p = self.plan.nodes[i]
        lines = []
        reads = None if p.operands is None else [self.graph.nodes[j] for j in p.operands]
        address, operands = self.native.bind(p.kernel, n, reads)
        run.steps.append(i)
        run.template += [address, len(operands)]
        fresh = {}
        for k, is_fresh in enumerate(p.fresh):
            if is_fresh:
                layout = self.plan.native_layouts[i][k]
                fresh[k] = f"v{i}_{k}"
                lines.append(f"{fresh[k]} = _empty_strided({tuple(layout.size)!r}, {tuple(layout.stride)!r}, "
                             f"dtype={em.render(layout.dtype)}, device={em.render(layout.device)})")
        for kind, what in operands:
            slot = len(run.template)
            if kind == "tensor":
                run.template.append(("tensor", what))
            elif kind == "out":
                if what in fresh:
                    run.template.append(None)
                    run.per_call.append((slot, fresh[what]))
                else:
                    run.template.append(("value", i, what))
            else:
                j = self._index[what.id]
                if j in self._fixed:
                    run.template.append(("value", j, 0))
                else:
                    run.template.append(None)
                    run.per_call.append((slot, names[what.id]))
                    guards.update(self._inputs_reaching(what))
        if fresh:
            names[n.id] = f"v{i}"
            if len(p.buffers) == 1:
                lines.append(f"v{i} = {fresh[0]}")
            else:
                parts = [fresh[k] if k in fresh else f"f{i}[{k}]" for k in range(len(p.buffers))]
                lines.append(f"v{i} = ({', '.join(parts)},)")
        return lines

    def _close_run(self, run: _Run, em) -> list:
        name = em.bind(self.native.runner, f"RUN{run.number}_")
        table = f"T[{run.number}]"
        # One statement: the values whose addresses the table holds stay alive until the run is done.
        fills = [f"{table}[{slot}] = {expr}.data_ptr()" for slot, expr in run.per_call]
        return ["; ".join(fills + [f"_rc = {name}({table}, {len(run.steps)})"]),
                f"if _rc: _NATIVE_ERROR({run.number}, _rc)"]

    def _native_error(self, run: int, code: int):
        self.native.error(code, [self.graph.nodes[i] for i in self._runs[run].steps])

    def _inputs_reaching(self, node: Node) -> set:
        """Placeholder indices whose layout decides ``node``'s layout (through per-call ops)."""
        position = {p.id: k for k, p in enumerate(self.graph.placeholders)}
        out, stack, seen = set(), [node], set()
        while stack:
            m = stack.pop()
            if m.id in seen:
                continue
            seen.add(m.id)
            if m.id in position and position[m.id] in self.plan.inputs:
                out.add(position[m.id])
            elif m.kind == "call" and self._index[m.id] not in self._fixed:
                stack.extend(m.inputs)
        return out

    def _outputs(self, em) -> str:
        """The returned structure; folded constants are copied (the caller may write what it gets)."""
        copied = {self.graph.nodes[i].id for i in self.plan.copy_outputs}

        def render(a):
            if isinstance(a, Node) and a.id in copied:
                return f"{em.render(a)}.clone()"
            if isinstance(a, (list, tuple)):
                inner = ", ".join(render(x) for x in a)
                return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
            return em.render(a)

        return render(self.graph.outputs)

    def _fallback(self, *args):
        if not self._warned:
            self._warned = True
            log.info("reduce-overhead: graph %s called with input strides its static kernels were not built for; "
                     "such calls run the plain generated code", self.graph.name)
        if self.ledger is not None:
            native = sum(p.kind == "native" for p in self.plan.nodes.values())
            self.ledger.slow("aten_fallbacks", f"graph {self.graph.name} was called with input strides its static "
                             "kernels were not built for; the call ran its plain code",
                             "pass inputs with the strides of the first calls (contiguous ones, usually)", n=native)
        return self.fallback(*args)


def _same_layout(x: torch.Tensor, stride: tuple) -> bool:
    """``x`` lies in memory as a tensor of these strides does: they differ only at dims of size 1, whose stride no
    address uses (a row cut from a wider batch-1 tensor is contiguous, but keeps its parent's stride there)."""
    return all(have == want or n == 1 for have, want, n in zip(x.stride(), stride, x.shape))


_VALUE = re.compile(r"\bv\d+(?:_\d+)?\b")
# Views whose result starts where their input does (same data pointer, other sizes and strides).
_SAME_ADDRESS_VIEWS = ops.overloads("view.default", "_unsafe_view.default", "permute.default", "t.default",
                                    "transpose.int", "expand.default", "unsqueeze.default", "squeeze.dim",
                                    "squeeze.dims", "squeeze.default", "alias.default", "detach.default")


def _drop_dead(body: list, keep: set) -> list:
    """``body`` with a ``del`` after the last statement reading each per-call value (as eager frees)."""
    last: dict[str, int] = {}
    for k, line in enumerate(body):
        for name in _VALUE.findall(line):
            if name not in keep:
                last[name] = k
    out = []
    for k, line in enumerate(body):
        out.append(line)
        dead = sorted(n for n, at in last.items() if at == k)
        if dead:
            out.append("del " + ", ".join(dead))
    return out


class _Tables(list):
    """The pointer tables of one binding, holding the tensors they point into."""

    def __init__(self, tables: list, keep: dict):
        super().__init__(tables)
        self.keep = keep


def _device_type(g: Graph) -> str:
    for p in g.nodes:
        if isinstance(p.meta, TensorMeta):
            return p.meta.device.type
    return "cpu"
