"""The house's layering, measured from the code's own imports (every import statement of every module of the
package, those inside functions too), so a new import that breaks a rule fails here rather than in a review:

* persist/ (rewrite's own files: format, safe reading, atomic writes) imports none of export/, cache/,
  kernels/, exec/: it is below all of them;
* egraph/ (the engine) imports no DSL: rules reach it compiled, as data;
* gears/, exec/ and cost/ import no optimizer: the driver (`rewrite.pipeline`) hands them what they need;
* no import cycle outside shape/ (whose two are a shape rule and the meta-kernel runner it falls back on,
  and the While fixpoint re-inferring its body);
* every module and package is on README.md's Layout map, and a module imports at load time (its top-level
  import statements) only from its own layer of the map and the layers above it;
* every test file is on tests/README.md's map of tests to rooms;
* no module imports another's private name (``from m import _name``) or reads it as ``m._name``, and no two
  modules share a file name outside the op-family mirrors (rules/, kernels/cgen/).
"""
from __future__ import annotations

import ast
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.join(REPO, "rewrite")


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


def _statements(tree: ast.Module, load_time: bool):
    """Every node of ``tree``, or with ``load_time`` only those run when the module is loaded: not inside a
    function (or lambda), nor under ``if TYPE_CHECKING:``."""
    if not load_time:
        yield from ast.walk(tree)
        return
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def _imports(name: str, path: str, load_time: bool = False) -> set[str]:
    """The package's modules that ``name`` imports, wherever the import statement stands (with ``load_time``:
    only those imported when the module is loaded)."""
    is_package = path.endswith("__init__.py")
    out = set()
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in _statements(tree, load_time):
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


# -- README.md's Layout map ----------------------------------------------------------------------------------


def _layout() -> list[tuple[str, list[tuple[list[str], str]]]]:
    """README.md's Layout map: its layers in order (a bold heading), each with its rows (paths, text)."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("\n## Layout"):]
    end = section.find("\n## ", 1)
    layers: list = []
    for line in section[:end if end > 0 else None].splitlines():
        heading = re.match(r"\*\*(.+?)\*\*", line)
        if heading:
            layers.append((heading.group(1), []))
        elif line.startswith("| `rewrite/") and layers:
            cell, _, holds = line[2:].partition(" | ")
            layers[-1][1].append((re.findall(r"`(rewrite/[^`]*)`", cell), holds))
    return layers


LAYOUT = _layout()


def _place(name: str) -> tuple[int, str, str] | None:
    """Where module ``name`` is on the map: (layer number, the row's path, the path left below it), or None."""
    path = os.path.relpath(MODULES[name], REPO).replace(os.sep, "/")
    best = None
    for number, (_, rows) in enumerate(LAYOUT):
        for paths, holds in rows:
            for p in paths:
                if path == p or (p.endswith("/") and path.startswith(p)):
                    if best is None or len(p) > len(best[1]):
                        best = (number, p, path[len(p):], holds)
    if best is None:
        return None
    number, row, rest, holds = best
    # below a package's row, each folder and file is named in the row's text (`cgen/`, `core.py`)
    parts = [part + "/" for part in rest.split("/")[:-1]] + [rest.split("/")[-1]] if rest else []
    parts = [part for part in parts if part != "__init__.py"]
    if any(f"`{part}`" not in holds for part in parts):
        return None
    return number, row, rest


def test_layout_map_is_read():
    names = [name for name, _ in LAYOUT]
    assert names[0] == "Ground floor" and len(names) >= 6, names
    assert _place("rewrite.ops")[0] == 0
    assert _place("rewrite.kernels.cgen.core")[1] == "rewrite/kernels/"


def test_every_module_is_on_the_readme_layout_map():
    missing = sorted(name for name in MODULES if _place(name) is None)
    assert not missing, f"not on README.md's Layout map (a row's path, or a file named in its package's row): {missing}"


LOAD_TIME = {name: _imports(name, path, load_time=True) for name, path in MODULES.items()}


def test_module_level_imports_follow_the_layout_layers():
    """A module imports, when it is loaded, only from its own layer and the layers above it on the map
    (imports the other way are made inside functions, when needed)."""
    offending = []
    for name, targets in LOAD_TIME.items():
        place = _place(name)
        for target in targets:
            there = _place(target)
            if place and there and there[0] > place[0]:
                offending.append(f"{name} ({LAYOUT[place[0]][0]}) imports {target} ({LAYOUT[there[0]][0]})")
    assert not offending, sorted(offending)


def test_load_time_imports_leave_out_those_inside_functions():
    """The measurement: user_passes.py infers shapes inside a function (one of the map's named exceptions),
    export/assembly.py imports capture only under TYPE_CHECKING, memory.py imports the IR at its top."""
    assert any(_in(t, "rewrite.shape") for t in GRAPH["rewrite.user_passes"])
    assert not any(_in(t, "rewrite.shape") for t in LOAD_TIME["rewrite.user_passes"])
    assert "rewrite.export.capture" in GRAPH["rewrite.export.assembly"]
    assert "rewrite.export.capture" not in LOAD_TIME["rewrite.export.assembly"]
    assert "rewrite.ir" in LOAD_TIME["rewrite.exec.memory"]


def test_every_test_file_is_on_the_tests_map():
    tests = os.path.join(REPO, "tests")
    with open(os.path.join(tests, "README.md"), encoding="utf-8") as f:
        text = f.read()
    missing = sorted(f for f in os.listdir(tests) if f.endswith(".py") and f"| `{f}` |" not in text)
    assert not missing, f"test files missing from tests/README.md: {missing}"


# The op-family mirrors: a rule family and the static-kernel generator of the same ops share a name on purpose.
_MIRRORS = ("rewrite/rules/", "rewrite/kernels/cgen/")


def test_no_two_modules_share_a_file_name_outside_the_op_family_mirrors():
    by_name: dict = {}
    for path in MODULES.values():
        rel = os.path.relpath(path, os.path.dirname(ROOT))
        if os.path.basename(path) != "__init__.py" and not rel.startswith(_MIRRORS):
            by_name.setdefault(os.path.basename(path), []).append(rel)
    assert not {b: p for b, p in by_name.items() if len(p) > 1}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_imports(name: str, path: str) -> list[str]:
    """``from <rewrite module> import _name`` statements of a module (a private alias of a public name is fine),
    and ``module._name`` where ``module`` is a name the module bound to another of the package's modules."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    out, modules = [], {}  # modules: local name -> the package's module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("rewrite")):
            out += [f"{path}: {node.module} {a.name}" for a in node.names if _private(a.name)]
            if node.level:
                parts = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module
            modules.update({a.asname or a.name: f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES})
        elif isinstance(node, ast.Import):
            modules.update({a.asname: a.name for a in node.names if a.asname and a.name in MODULES})
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                and modules.get(node.value.id, name) != name):
            out.append(f"{path}:{node.lineno}: {modules[node.value.id]}.{node.attr}")
    return out


def test_no_private_name_is_imported_across_modules():
    found = [line for name, path in MODULES.items() for line in _private_imports(name, path)]
    assert not found, "\n".join(found)


def _face_statements(path: str) -> list[str]:
    """What a package's __init__.py holds besides its guide (the docstring), its imports and ``__all__``; a face
    may load its re-exports on first use (PEP 562: ``__getattr__`` and the table of names it loads)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    lazy = any(isinstance(s, ast.FunctionDef) and s.name == "__getattr__" for s in tree.body)
    out = []
    for i, st in enumerate(tree.body):
        if i == 0 and isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
            continue  # the guide
        if isinstance(st, (ast.Import, ast.ImportFrom)):
            continue
        targets = [getattr(t, "id", None) for t in st.targets] if isinstance(st, ast.Assign) else []
        if targets == ["__all__"]:
            continue
        if lazy and (isinstance(st, ast.FunctionDef) and st.name == "__getattr__"
                     or isinstance(st, ast.Assign) and isinstance(st.value, ast.Dict)):
            continue
        out.append(f"{os.path.relpath(path, REPO)}:{st.lineno}: {ast.unparse(st).splitlines()[0]}")
    return out


def test_package_faces_hold_only_re_exports_and_a_guide():
    found = [line for path in MODULES.values() if path.endswith("__init__.py") for line in _face_statements(path)]
    assert not found, "a package's __init__.py holds more than its guide, imports and __all__:\n" + "\n".join(found)


def test_the_face_check_catches_code():
    """The measurement: code in a face is found (a function, a call, a loop); a guide, imports, __all__ and a lazy
    loader are not."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "__init__.py")
        with open(path, "w") as f:
            f.write('"""guide"""\nimport os\n__all__ = ["f"]\ndef f():\n    pass\nos.getcwd()\nfor x in ():\n    pass\n')
        assert len(_face_statements(path)) == 3
        with open(path, "w") as f:
            f.write('"""guide"""\n__all__ = ["f"]\n_LAZY = {"f": ("m", "f")}\ndef __getattr__(name):\n    pass\n')
        assert _face_statements(path) == []
