"""Shrinking a graph a compiler gets wrong, and writing it as a standalone reproduction script.

`shrink_graph(gm, calls, still_fails)` makes a failing FX graph small the way torch's minifier does,
with the checker's own test of "still fails": keep the one output that differs, stop the graph at the
earliest node whose value already differs (a binary search, then single steps), then cut the inputs
of what is left: an intermediate value becomes a new input holding the value eager computes for it.
Each step is accepted only when the compiler still disagrees with eager on the smaller graph.

`repro_script(...)` writes what is left as a script that needs torch (and rewrite, for a rewrite
target) and nothing of rewrite.testing: the graph as an ``nn.Module`` whose ``forward`` is the FX
code, every tensor written out exactly (small ones as literals, larger ones as base64 of their
bytes), the compile line of the target, and a loop that calls both and exits with status 1, printing
the elements that differ, when they disagree.
"""
from __future__ import annotations

import base64
import time
from typing import Callable, Sequence

import torch
import torch.fx

__all__ = ["shrink_graph", "drop_unused_inputs", "repro_script", "tensor_source"]

LITERAL_ELEMENTS = 64  # tensors up to this many elements are written as literals, larger ones as bytes


# ================================================================================================
# Shrinking
# ================================================================================================

def _returns_tensor(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    if val is not None:
        return isinstance(val, torch.Tensor)
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    returns = target._schema.returns
    return len(returns) == 1 and isinstance(returns[0].type, torch.TensorType)


def _tensor_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The nodes computing one tensor: where a graph can be stopped or cut."""
    return [n for n in gm.graph.nodes if n.op == "call_function" and _returns_tensor(n)]


def _with_output(gm: torch.fx.GraphModule, values: list) -> torch.fx.GraphModule:
    """A copy of ``gm`` returning ``values`` (nodes of ``gm``), with what they do not need removed.

    Input updates (``copy_`` into a placeholder) are dropped: the output alone is what differs."""
    graph = torch.fx.Graph()
    env: dict = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            break
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[v] for v in values))
    for node in reversed(list(graph.nodes)):
        if node.op in ("call_function", "get_attr") and not node.users:
            graph.erase_node(node)
    return torch.fx.GraphModule(gm, graph)


def _updates_only(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` that returns nothing but keeps its input updates (what differs is an updated input)."""
    graph = torch.fx.Graph()
    env: dict = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            break
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(())
    for node in reversed(list(graph.nodes)):
        if node.op in ("call_function", "get_attr") and not node.users and not node.is_impure():
            graph.erase_node(node)
    return torch.fx.GraphModule(gm, graph)


def _cut(gm: torch.fx.GraphModule, node_name: str) -> tuple[torch.fx.GraphModule, int]:
    """A copy of ``gm`` where node ``node_name`` is a new last input (its readers read the input);
    returns the module and the index of the new input."""
    graph = torch.fx.Graph()
    env: dict = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node in placeholders:
        env[node] = graph.node_copy(node, lambda n: env[n])
    cut = graph.placeholder(f"cut_{node_name}")
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.name == node_name:
            env[node] = cut
            cut.meta = dict(node.meta)
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    for node in reversed(list(graph.nodes)):
        if node.op in ("call_function", "get_attr") and not node.users and not node.is_impure():
            graph.erase_node(node)
    return torch.fx.GraphModule(gm, graph), len(placeholders)


def _values_of(gm: torch.fx.GraphModule, node_name: str, calls: list[list]) -> list:
    """The value eager computes for node ``node_name`` in each call."""
    node = next(n for n in gm.graph.nodes if n.name == node_name)
    probe = _with_output(gm, [node])
    out = []
    with torch.no_grad():
        for args in calls:
            out.append(probe(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])[0])
    return out


def shrink_graph(gm: torch.fx.GraphModule, calls: list[list], output: int | None,
                 still_fails: Callable[[torch.fx.GraphModule, list[list]], bool],
                 seconds: float = 60.0) -> tuple[torch.fx.GraphModule, list[list], int]:
    """The smallest graph (and the inputs of each call) on which ``still_fails`` holds, found within
    about ``seconds``; ``output``: the index of the flat output that differs (None: an updated input
    or a crash; then the outputs are kept). Returns the graph, its calls and how many steps were tried."""
    deadline = time.monotonic() + seconds
    tried = 0

    def attempt(candidate, candidate_calls) -> bool:
        nonlocal tried
        tried += 1
        try:
            return bool(still_fails(candidate, candidate_calls))
        except Exception:  # noqa: BLE001 - a candidate that breaks otherwise is simply not smaller
            return False

    if output is None:  # an updated input differs: the outputs may go
        candidate = _updates_only(gm)
        if attempt(candidate, calls):
            gm = candidate
    else:
        outs = list(next(n for n in gm.graph.nodes if n.op == "output").args[0])
        flat = outs if isinstance(outs, list) else [outs]
        if 0 <= output < len(flat) and isinstance(flat[output], torch.fx.Node):
            candidate = _with_output(gm, [flat[output]])
            if attempt(candidate, calls):
                gm = candidate
        # The earliest node whose value already differs: a binary search over the graph's order (a
        # wrong value usually reaches the output), then the nodes just before the one found.
        nodes = _tensor_nodes(gm)
        lo, hi = 0, len(nodes) - 1
        while lo < hi and time.monotonic() < deadline:
            mid = (lo + hi) // 2
            candidate = _with_output(gm, [nodes[mid]])
            if attempt(candidate, calls):
                hi = mid
            else:
                lo = mid + 1
        if hi < len(nodes) - 1 and time.monotonic() < deadline:
            candidate = _with_output(gm, [nodes[hi]])
            if attempt(candidate, calls):
                gm = candidate
    # Cut: replace intermediate values by inputs holding them, nearest the output first.
    changed = True
    while changed and time.monotonic() < deadline:
        changed = False
        for node in reversed(_tensor_nodes(gm)):
            if time.monotonic() > deadline:
                break
            if any(u.op == "output" for u in node.users):
                continue  # the value that differs itself
            if not any(a.op in ("call_function",) for a in node.all_input_nodes):
                continue  # reads only inputs and constants: cutting it saves nothing
            try:
                values = _values_of(gm, node.name, calls)
            except Exception:  # noqa: BLE001
                continue
            candidate, _ = _cut(gm, node.name)
            candidate_calls = [list(args) + [v] for args, v in zip(calls, values)]
            if attempt(candidate, candidate_calls):
                gm, calls, changed = candidate, candidate_calls, True
                break
    return gm, calls, tried


def drop_unused_inputs(gm: torch.fx.GraphModule, calls: list[list]) -> tuple[torch.fx.GraphModule, list[list], list[int]]:
    """``gm`` without the inputs nothing reads (a model's frozen weights stay placeholders of its graph),
    the calls without their values, and the indices of the inputs kept."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    keep = [i for i, n in enumerate(placeholders) if n.users]
    if len(keep) == len(placeholders):
        return gm, calls, keep
    graph = torch.fx.Graph()
    env: dict = {}
    for i, node in enumerate(placeholders):
        if i in keep:
            env[node] = graph.node_copy(node, lambda n: env[n])
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            env[node] = graph.node_copy(node, lambda n: env[n])
    return torch.fx.GraphModule(gm, graph), [[args[i] for i in keep] for args in calls], keep


# ================================================================================================
# The script
# ================================================================================================

def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype)  # "torch.float32"


def tensor_source(t) -> str:
    """Python source recreating ``t`` exactly (values, dtype, shape; contiguous)."""
    if not isinstance(t, torch.Tensor):
        return repr(t)
    t = t.detach().cpu()
    shape = tuple(t.shape)
    if t.numel() == 0:
        return f"torch.empty({list(shape)}, dtype={_dtype_name(t.dtype)})"
    if t.numel() <= LITERAL_ELEMENTS:
        return f"torch.tensor({t.tolist()!r}, dtype={_dtype_name(t.dtype)})"
    data = base64.b64encode(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).decode()
    return f"_raw({data!r}, {_dtype_name(t.dtype)}, {list(shape)})"


def _module_source(gm: torch.fx.GraphModule) -> str:
    lines = ["class Repro(torch.nn.Module):", "    def __init__(self):", "        super().__init__()"]
    tensors = dict(gm.named_buffers())
    tensors.update(dict(gm.named_parameters()))
    for node in gm.graph.find_nodes(op="get_attr"):
        obj = gm
        for part in node.target.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, torch.Tensor):
            tensors[node.target] = obj
    for name, value in tensors.items():
        if "." in name:
            raise ValueError(f"constant {name} of a submodule: flatten the graph module first")
        lines.append(f"        self.register_buffer({name!r}, {tensor_source(value)})")
    code = gm.code.strip("\n")
    lines += ["", *("    " + line if line.strip() else "" for line in code.splitlines())]
    return "\n".join(lines)


_HELPERS = '''
def _raw(data, dtype, shape):
    return torch.frombuffer(bytearray(base64.b64decode(data)), dtype=dtype).reshape(shape).clone()


def _flat(value):
    return torch.utils._pytree.tree_flatten(value)[0]


def _differs(expected, got, exact):
    """None when equal (NaN matches NaN; floats within (RTOL, ATOL) unless exact), else why."""
    if not isinstance(expected, torch.Tensor):
        return None if expected == got else f"expected {expected!r}, got {got!r}"
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape or got.dtype != expected.dtype:
        return f"expected a {expected.dtype} tensor of shape {tuple(expected.shape)}, got {got!r}"
    e, g = expected.detach().cpu(), got.detach().cpu()
    if e.dtype.is_floating_point:
        e, g = e.double(), g.double()
        if exact:
            bad = ~(e.isnan() & g.isnan()) & ((e != g) | (torch.signbit(e) != torch.signbit(g)))
        else:
            bad = ~torch.isclose(g, e, rtol=RTOL, atol=ATOL, equal_nan=True)
    else:
        bad = e != g
    if not bad.any():
        return None
    idx = [tuple(int(i) for i in row) for row in bad.nonzero()[:4]]
    items = "; ".join(f"at {list(i)}: expected {e[i].item()!r}, got {g[i].item()!r}" for i in idx)
    return f"{int(bad.sum())} of {e.numel()} elements differ: {items}"
'''


def repro_script(gm: torch.fx.GraphModule, calls: list[list], target_lines: Sequence[str], *, title: str,
                 exact: bool, tol: tuple[float, float], gears: Sequence[tuple[int, dict]] = (),
                 context_lines: Sequence[str] = ()) -> str:
    """A standalone script reproducing a disagreement: ``gm`` called with each of ``calls`` in eager
    and compiled by ``target_lines`` (which set ``compiled`` from ``model``); ``gears``: `set_dim_gears`
    calls on the first call's inputs, as ``(input index, {dim: [sizes]})``."""
    rtol, atol = tol
    call_lines = []
    for args in calls:
        call_lines.append("        [" + ", ".join(tensor_source(a) for a in args) + "],")
    gear_lines = [f"rewrite.inference.set_dim_gears(CALLS[0][{i}], dim_gears={dims!r})" for i, dims in gears]
    body = [
        f'"""{title}',
        "",
        "Written by rewrite.testing.check_backend. Runs the graph below in eager and compiled, call by call,",
        'and exits with status 1 when they disagree."""',
        "import base64",
        "import math",
        "import operator",
        "import sys",
        "from math import inf, nan",
        "",
        "import torch",
        "from torch import device",
        "",
        f"RTOL, ATOL, EXACT = {rtol!r}, {atol!r}, {exact!r}",
        _HELPERS,
        "",
        _module_source(gm),
        "",
        "",
        "def calls():",
        "    return [",
        *call_lines,
        "    ]",
        "",
        "",
        "torch.manual_seed(0)",
        "model = Repro()",
        *target_lines,
        "CALLS = calls()",
        *gear_lines,
        "failed = False",
        "with torch.no_grad():",
        "    for k, args in enumerate(CALLS):",
        "        eager_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]",
        "        expected = _flat(model(*eager_args))",
        "        got = _flat(compiled(*args))",
        "        problems = [f'output {i}: {why}' for i, (e, g) in enumerate(zip(expected, got))",
        "                    if (why := _differs(e, g, EXACT))]",
        "        if len(got) != len(expected):",
        "            problems.append(f'{len(got)} outputs, expected {len(expected)}')",
        "        problems += [f'input {i} after the call: {why}' for i, (e, g) in enumerate(zip(eager_args, args))",
        "                     if isinstance(e, torch.Tensor) and (why := _differs(e, g, EXACT))]",
        "        for p in problems:",
        "            print(f'call {k}: {p}')",
        "        failed = failed or bool(problems)",
        "if failed:",
        "    print('REPRODUCED: the compiled graph disagrees with eager')",
        "    sys.exit(1)",
        "print('not reproduced: compiled and eager agree')",
    ]
    if context_lines:
        body[body.index("torch.manual_seed(0)"):body.index("torch.manual_seed(0)")] = list(context_lines)
    return "\n".join(body) + "\n"
