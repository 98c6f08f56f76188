"""The house's layering, measured from the code's own imports (every import statement of every module of the
package, those inside functions too), so a new import that breaks a rule fails here rather than in a review:

* persist/ (rewrite's own files: format, safe reading, atomic writes) imports none of export/, cache/,
  kernels/, exec/: it is below all of them;
* egraph/ (the engine) imports no DSL: rules reach it compiled, as data;
* gears/, exec/ and cost/ import no optimizer: the driver (`rewrite.pipeline`) hands them what they need;
* no import cycle outside shape/ (whose two are a shape rule and the meta-kernel runner it falls back on,
  and the While fixpoint re-inferring its body).
"""
from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rewrite")


def _modules() -> dict[str, str]:
    """Dotted module name -> file path, for every module of the package."""
    out = {}
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, f), os.path.dirname(ROOT))[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(rel)] = os.path.join(folder, f)
    return out


MODULES = _modules()


def _imports(name: str, path: str) -> set[str]:
    """The package's modules that ``name`` imports, wherever the import statement stands."""
    is_package = path.endswith("__init__.py")
    out = set()
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".") if is_package else name.split(".")[:-1]
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:  # `import rewrite.exec.x as y` names a module; a name in it is its module
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("low, high", [
    ("rewrite.persist", "rewrite.export"), ("rewrite.persist", "rewrite.cache"),
    ("rewrite.persist", "rewrite.kernels"), ("rewrite.persist", "rewrite.exec"),
    ("rewrite.egraph", "rewrite.dsl"),
    ("rewrite.gears", "rewrite.optimizer"), ("rewrite.exec", "rewrite.optimizer"),
    ("rewrite.cost", "rewrite.optimizer"),
])
def test_layering_a_lower_package_imports_nothing_above_it(low, high):
    offending = sorted(f"{m} imports {t}" for m, targets in GRAPH.items() if _in(m, low)
                       for t in targets if _in(t, high))
    assert not offending, offending


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_layering_no_import_cycle_outside_shape():
    # A package's __init__ that re-exports its own modules is its face, not a cycle: edges into a package
    # from its own modules are left out (`from . import x` inside rewrite.exec names rewrite.exec.x anyway).
    graph = {m: {t for t in targets if not _in(m, t)} for m, targets in GRAPH.items()}
    cycles = [c for c in _cycles(graph) if not all(_in(m, "rewrite.shape") for m in c)]
    assert not cycles, cycles


def test_layering_measures_what_it_claims():
    """The measurement itself: it sees imports inside functions, relative ones, and a planted cycle."""
    assert "rewrite.optimizer" in GRAPH["rewrite.pipeline"]  # imported inside a method (Stages.optimize_gear)
    assert "rewrite.ir" in GRAPH["rewrite.exec.memory"]  # `from ..ir import ...`
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert any(all(_in(m, "rewrite.shape") for m in c) for c in _cycles(GRAPH))  # shape's own, allowed above
