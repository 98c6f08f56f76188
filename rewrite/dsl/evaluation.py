"""Evaluating and matching patterns on concrete values (used by `rewrite.testing` and by rules whose
replacement is computed in Python): `evaluate` a pattern under a binding, `match` one against a tree of
`Call` records."""
from __future__ import annotations

import dataclasses
from typing import Any

from ..ops import canonical_call
from .patterns import Lit, OpPattern, RuleError, Var, same_value


def evaluate(p, binding: dict):
    """Evaluate a pattern (or literal) with variables taken from ``binding``."""
    if isinstance(p, Var):
        if p.name not in binding:
            raise RuleError(f"variable {p.name!r} is not bound (bound: {sorted(binding)})")
        return binding[p.name]
    if isinstance(p, Lit):
        return evaluate(p.value, binding)
    if isinstance(p, OpPattern):
        args = [evaluate(a, binding) for a in p.args]
        kwargs = {k: evaluate(v, binding) for k, v in p.kwargs.items()}
        return p.target(*args, **kwargs)
    if isinstance(p, list):
        return [evaluate(a, binding) for a in p]
    if isinstance(p, tuple):
        return tuple(evaluate(a, binding) for a in p)
    return p


@dataclasses.dataclass
class Call:
    """A concrete call record ``target(*args, **kwargs)`` for `match` (args may nest Calls)."""

    target: Any
    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)


def match(p, tree, binding: dict | None = None) -> dict | None:
    """Match pattern ``p`` against ``tree`` (Calls / values); returns the binding or None."""
    binding = {} if binding is None else binding
    if isinstance(p, Var):
        if p.name in binding:
            return binding if same_value(binding[p.name], tree) else None
        binding[p.name] = tree
        return binding
    if isinstance(p, OpPattern):
        if not isinstance(tree, Call) or tree.target is not p.target:
            return None
        args, kwargs = canonical_call(tree.target, tree.args, tree.kwargs)
        if len(args) != len(p.args) or set(kwargs) != set(p.kwargs):
            return None
        for a, t in zip(p.args, args):
            if match(a, t, binding) is None:
                return None
        for k, a in p.kwargs.items():
            if match(a, kwargs[k], binding) is None:
                return None
        return binding
    if isinstance(p, Lit):
        return match(p.value, tree, binding)
    if isinstance(p, (list, tuple)):
        if not isinstance(tree, (list, tuple)) or len(tree) != len(p):
            return None
        for a, t in zip(p, tree):
            if match(a, t, binding) is None:
                return None
        return binding
    return binding if same_value(p, tree) else None
