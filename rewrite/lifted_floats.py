"""Floats Dynamo lifted from globals and attributes become the numbers they are.

Under ``dynamic=True`` Dynamo passes a Python float the model reads as a 0-d float64 input read with ``.item()``
(``math.pi`` in transformers' ``NewGELUActivation``, a module's ``self.scale``). Whatever is computed from it then
runs on every call, and no fold or rewrite sees a constant: GPT-2's tanh GELU kept its eight ops on a
``dynamic=True`` graph (``sqrt(2 / pi)`` computed at run time), where its gears fuse it to one ``gelu``.

A float read from a global or an attribute is a constant of the model; one the caller passes (``f(x, 0.5)``) is
an argument and stays an input. The first is handed back to Dynamo to specialize: it traces the frame again with
the number in the graph and a guard on it (`torch_compat.specialize_floats`, the mechanism Dynamo's own tensorify
pass uses for floats it cannot keep), so a reassigned global or attribute is a recompile Dynamo guards and
`rewrite.stats(...).recompiles` counts, never a stale result.
"""
from __future__ import annotations

import re

import torch
import torch.fx

__all__ = ["constant_float_symbols"]

# Dynamo's source name of a value read from a global or through an attribute (``G['mod'].math.pi``,
# ``L['self'].scale``); an argument is ``L['k']``, ``L['kwargs']['k']``, ``L['args'][0]``.
_GLOBAL_OR_ATTRIBUTE = re.compile(r"G\[.+|L\['[^']+'\].*\.[A-Za-z_]\w*")


def constant_float_symbols(gm: torch.fx.GraphModule, names: list[str]) -> list[str]:
    """The ShapeEnv symbols of the floats Dynamo lifted into ``gm`` from globals or attributes (``names``:
    Dynamo's source name of each input, `fx_bridge.dynamo_input_names`)."""
    symbols = []
    for p, name in zip(gm.graph.find_nodes(op="placeholder"), names):
        fake = p.meta.get("example_value")
        memo = getattr(fake, "item_memo", None)  # the SymFloat of its ``.item()``
        if (_GLOBAL_OR_ATTRIBUTE.fullmatch(name) and isinstance(fake, torch.Tensor) and fake.dim() == 0
                and fake.dtype == torch.float64 and memo is not None and hasattr(memo.node._expr, "name")
                and p.users and all(u.op == "call_method" and u.target == "item" for u in p.users)):
            symbols.append(memo.node._expr.name)
    return symbols
