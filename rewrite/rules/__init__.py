"""The rule library: DSL rulesets, one module per family.

* ``shape_ops`` - view/reshape/permute/expand/slice/cat/cast identities
* ``algebra``   - algebraic identities

A rule module contributes ``RULESETS: list[RuleSet]``. Which rulesets run, in which order and how
often is `rewrite.optimizer.SCHEDULE`; hand-written passes (folding, dedup, dead edges) live in
`rewrite.passes`. Users add rulesets through ``CompilerConfig().rules.extra``.
"""
from __future__ import annotations

import importlib

from ..dsl import RuleSet

__all__ = ["default_rulesets", "check_user_rulesets", "rulesets_of"]


def rulesets_of(module_names) -> list[RuleSet]:
    """The rulesets of the named rule modules, in the order given."""
    out: list[RuleSet] = []
    for name in module_names:
        out.extend(importlib.import_module(f"{__name__}.{name}").RULESETS)
    return out


def default_rulesets() -> list[RuleSet]:
    """The library's rulesets, in the order the schedule runs them."""
    from ..optimizer import SCHEDULE

    return rulesets_of(SCHEDULE.saturation.rule_modules)


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
