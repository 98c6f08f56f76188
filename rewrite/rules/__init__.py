"""The rule library registry: which rulesets run by default, in which order.

Families (one module each):

* ``folding``   - constant folding and size folding (Python passes: evaluate with torch)
* ``cse``       - constant de-duplication by content (CSE itself is the e-graph's hash-consing)
* ``dead_edge`` - ``torch.cond`` with a compile-time predicate -> the selected branch
* ``algebra``   - algebraic identities (DSL rulesets, run in the e-graph)
* ``shape_ops`` - view/reshape/permute/expand/slice/cat/cast identities (DSL rulesets)

A rule module contributes ``RULESETS: list[RuleSet]``. `default_rulesets()` returns them in
schedule order; users append their own through ``CompilerConfig().rules.extra``.
"""
from __future__ import annotations

import importlib
import logging

from ..dsl import RuleSet

log = logging.getLogger("rewrite")

__all__ = ["default_rulesets", "describe_rulesets", "RULE_MODULES", "PASSES"]

# Modules holding DSL rulesets, in schedule order (shape ops first: they expose algebra matches).
RULE_MODULES = ("shape_ops", "algebra")

# Python passes that run on the IR between e-graph rounds (name -> what it does). CSE is not
# one: equal computations are one e-class of the e-graph (counted as ``cse`` in reports).
PASSES = {
    "dead_edge": "torch.cond with a compile-time predicate -> the selected branch inlined",
    "fold": "ops whose inputs are all constants are evaluated with torch (size cap: rules.fold_size_limit)",
    "fold_sizes": "size computations whose value is a constant expression become constants",
    "dedup": "constants with identical contents become one constant",
    "prune": "only what reaches an output or has a side effect survives",
}

def default_rulesets() -> list[RuleSet]:
    """The default DSL rulesets, in the order they are scheduled."""
    out: list[RuleSet] = []
    for name in RULE_MODULES:
        out.extend(importlib.import_module(f"{__name__}.{name}").RULESETS)
    return out


def check_user_rulesets(extra) -> list[RuleSet]:
    """``config.rules.extra`` validated: a list of RuleSet objects with names not taken."""
    taken = {rs.name for rs in default_rulesets()}
    for i, rs in enumerate(extra):
        if not isinstance(rs, RuleSet):
            raise TypeError(f"config.rules.extra[{i}] is a {type(rs).__name__}; expected a rewrite.dsl.RuleSet")
        if rs.name in taken:
            raise ValueError(f"config.rules.extra[{i}]: ruleset name {rs.name!r} is already used; pick another name")
        taken.add(rs.name)
    return list(extra)


def describe_rulesets(extra=()) -> str:
    """A readable listing of the passes, rulesets and rules (``python -m rewrite rules``)."""
    lines = ["Python passes (run on the IR between e-graph rounds):"]
    width = max(len(k) for k in PASSES)
    lines += [f"  {name:<{width}}  {what}" for name, what in PASSES.items()]
    lines.append("  (CSE is no pass: equal computations are one e-class of the e-graph; reports count it as cse)")
    sets = default_rulesets() + list(extra)
    total = sum(len(rs) for rs in sets)
    lines.append("")
    lines.append(f"Rulesets ({len(sets)} sets, {total} rules; run in this order, each up to its iterations per round):")
    for rs in sets:
        head = f"  {rs.name}  ({len(rs)} rules, {rs.iterations} iterations)"
        if rs.description:
            head += f"  - {rs.description}"
        lines.append(head)
        for r in rs.rules:
            lines.append(f"    {r!r}")
    return "\n".join(lines)
