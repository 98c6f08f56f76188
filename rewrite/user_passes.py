"""Users' torch.fx passes: how rewrite calls them, in one place for the backend's
``post_grad_custom_pre_pass`` / ``post_grad_custom_post_pass`` hooks and for
`rewrite.testing.check_fx_pass`, so a pass that check_fx_pass accepts runs the same way in a compile.

A pass comes in one of the shapes the ecosystem writes:

* ``fn(gm)``: torch.fx style; returns a GraphModule (or a Graph), or edits ``gm`` in place and
  returns None (Inductor's pattern passes return a count: also in place);
* ``fn(gm, example_inputs, config)``: TorchAir's ``post_grad_custom_*_pass`` (it edits ``gm`` in
  place; a GraphModule it returns is used);
* an Inductor ``CustomGraphPass`` object: called with ``gm.graph``, as Inductor calls it.

In the backend the pre pass gets the AOT (core ATen) graph before rewrite imports it; the post pass
gets the optimized graph as an FX GraphModule (``meta['val']`` on every node; stream tags and wait
edges ride along in node meta) and its result is imported again. Nodes a pass adds without
``meta['val']`` get their shapes inferred. A pass that raises or leaves a malformed graph is a
`CompileError` naming the config field and the pass.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import sys

import torch
import torch.fx

from .fx_bridge import CompileError, from_fx, to_fx

log = logging.getLogger("rewrite")

__all__ = ["takes_graph", "pass_environment", "apply_fx_pass", "pass_name", "run_pre_pass", "run_post_pass",
           "POST_GRAD_FIELDS"]

POST_GRAD_FIELDS = ("post_grad_custom_pre_pass", "post_grad_custom_post_pass")


def takes_graph(pass_fn) -> bool:
    """Inductor's custom graph passes (``CustomGraphPass``) are called with ``gm.graph``, as Inductor does."""
    return any(c.__name__ == "CustomGraphPass" and c.__module__.startswith("torch._inductor")
               for c in type(pass_fn).__mro__)


def _takes_context(pass_fn) -> bool:
    """Whether ``pass_fn`` takes TorchAir's three arguments ``(gm, example_inputs, config)``."""
    try:
        inspect.signature(pass_fn).bind(None, None, None)
    except (TypeError, ValueError):
        return False
    return True


def pass_name(pass_fn) -> str:
    return getattr(pass_fn, "__qualname__", None) or getattr(pass_fn, "__name__", None) or type(pass_fn).__name__


def pass_environment(gm: torch.fx.GraphModule):
    """Inductor runs its graph passes with ``V.fake_mode`` set: do the same when the pass uses Inductor."""
    if "torch._inductor.virtualized" not in sys.modules:
        return contextlib.nullcontext()
    from torch._inductor.virtualized import V

    mode = _fake_mode(gm)
    return V.set_fake_mode(mode) if mode is not None else contextlib.nullcontext()


def _fake_mode(gm: torch.fx.GraphModule):
    from torch._guards import detect_fake_mode

    vals = [n.meta.get("val") for n in gm.graph.nodes]
    return detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])


def _example_inputs(gm: torch.fx.GraphModule) -> list:
    return [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]


def apply_fx_pass(pass_fn, gm: torch.fx.GraphModule, takes: str = "module", *, example_inputs=None,
                  config=None) -> torch.fx.GraphModule:
    """Run the pass the way its shape expects; return the (linted, recompiled) module to run afterwards.

    ``example_inputs`` / ``config`` are what a TorchAir-style pass gets (default: the placeholders'
    ``meta['val']`` and a default `CompilerConfig`).
    """
    if takes == "graph":
        call = lambda: pass_fn(gm.graph)  # noqa: E731
    elif _takes_context(pass_fn):
        if config is None:
            from .config import CompilerConfig

            config = CompilerConfig()
        inputs = _example_inputs(gm) if example_inputs is None else example_inputs
        call = lambda: pass_fn(gm, inputs, config)  # noqa: E731
    else:
        call = lambda: pass_fn(gm)  # noqa: E731
    with pass_environment(gm):
        result = call()
    if isinstance(result, torch.fx.GraphModule):
        out = result
    elif isinstance(result, torch.fx.Graph):
        out = gm if result is gm.graph else torch.fx.GraphModule(gm, result)
    elif hasattr(result, "graph_module"):  # torch.fx.passes.infra PassResult
        out = result.graph_module
    elif result is None or isinstance(result, (bool, int)):  # in place (pattern passes return a count)
        out = gm
    else:
        raise TypeError(f"the pass returned {type(result).__name__}; expected a GraphModule, a Graph, or None "
                        "(after changing the graph in place)")
    out.graph.lint()
    out.recompile()
    return out


def _run(field: str, pass_fn, gm: torch.fx.GraphModule, example_inputs, config, unit) -> torch.fx.GraphModule:
    phase = "backward" if unit.kind == "backward" else "forward"  # TorchAir logs inference graphs as forward
    log.debug("[%s] before [%s] execution, graph is %s", phase, field, gm.graph)
    takes = "graph" if takes_graph(pass_fn) else "module"
    try:
        out = apply_fx_pass(pass_fn, gm, takes, example_inputs=example_inputs, config=config)
    except Exception as e:
        raise CompileError(f"graph {unit.name}: config.{field} ({pass_name(pass_fn)}) failed: "
                           f"{type(e).__name__}: {e}") from e
    log.debug("[%s] after [%s] execution, graph is %s", phase, field, out.graph)
    return out


def _imported(field: str, pass_fn, gm: torch.fx.GraphModule, name: str):
    """The pass's result as an IR graph; nodes it added without ``meta['val']`` get inferred metas."""
    from .shape import infer_graph

    try:
        graph = from_fx(gm, name=name)
        infer_graph(graph, missing_only=True)
    except Exception as e:
        raise CompileError(f"graph {name}: the graph config.{field} ({pass_name(pass_fn)}) returned cannot be "
                           f"compiled: {e}") from e
    return graph


def run_pre_pass(gm: torch.fx.GraphModule, example_inputs, unit, name: str):
    """``config.post_grad_custom_pre_pass`` on the AOT graph, then the IR import (`from_fx`) as ``name``."""
    config = unit.config
    pass_fn = config.post_grad_custom_pre_pass
    if pass_fn is None:
        return from_fx(gm, name=name)
    gm = _run(POST_GRAD_FIELDS[0], pass_fn, gm, example_inputs, config, unit)
    return _imported(POST_GRAD_FIELDS[0], pass_fn, gm, name)


def run_post_pass(graph, gm_traced: torch.fx.GraphModule, example_inputs, unit):
    """``config.post_grad_custom_post_pass`` on the optimized IR ``graph`` (as FX), imported back.

    ``gm_traced`` is the AOT graph the compile started from: its fake mode makes ``meta['val']``.
    """
    config = unit.config
    pass_fn = config.post_grad_custom_post_pass
    if pass_fn is None:
        return graph
    fake_mode = _fake_mode(gm_traced)
    gm = to_fx(graph, fake_mode) if fake_mode is not None else to_fx(graph)
    gm = _run(POST_GRAD_FIELDS[1], pass_fn, gm, example_inputs, config, unit)
    new = _imported(POST_GRAD_FIELDS[1], pass_fn, gm, graph.name)
    new.symbols = {**new.symbols, **graph.symbols}
    return new
