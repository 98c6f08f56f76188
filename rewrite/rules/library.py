"""The library's rulesets as one value (`LIBRARY`, in the order the schedule runs them: its one home) and what a compile does
with them: users' rulesets checked (`check_user_rulesets`), rules switched off by name (`without`), the rules
this build leaves out (`left_out`)."""
from __future__ import annotations

import dataclasses
import difflib
import threading

from ..config import ConfigError, RulesConfig
from ..dsl import RuleSet
from . import algebra, fused, gemm, shape_ops

__all__ = ["LIBRARY", "default_rulesets", "check_user_rulesets", "without", "ruleset_family", "left_out"]

# The order of the saturation (`rewrite.optimizer.SCHEDULE` runs LIBRARY as it stands): the modules in this order,
# each module's RULESETS in its own. Shape ops first: they expose algebra matches; GEMM rules and fused kernels see
# the cleaned graph.
_MODULES = (shape_ops, algebra, gemm, fused)
LIBRARY: tuple[RuleSet, ...] = tuple(rs for module in _MODULES for rs in module.RULESETS)


def default_rulesets() -> list[RuleSet]:
    """The library's rulesets, in the order the schedule runs them (`LIBRARY`; how often each runs is the
    schedule's: `rewrite.optimizer.library_runs`)."""
    return list(LIBRARY)


def left_out() -> list[str]:
    """Rules the library leaves out in this build, with why (a fused kernel it lacks). Read when
    asked: a rule module records them as it loads."""
    return [why for module in _MODULES for why in getattr(module, "LEFT_OUT", ())]


def check_user_rulesets(extra) -> list[RuleSet]:
    """``config.rules.extra`` as a compile uses it: RuleSet objects (the config field's own check, again: the
    list may have been changed in place since it was assigned) whose names no other ruleset has."""
    extra = RulesConfig.extra.check("config.rules.extra", extra)
    taken = {rs.name for rs in default_rulesets()}
    for i, rs in enumerate(extra):
        if rs.name in taken:
            raise ValueError(f"config.rules.extra[{i}]: ruleset name {rs.name!r} is already used; pick another name")
        taken.add(rs.name)
    return extra


def ruleset_family(ruleset_name: str) -> str:
    """A ruleset's family: its name up to the first dot (``gemm.merge_parallel`` -> ``gemm``)."""
    return ruleset_name.split(".", 1)[0]


_derived: dict = {}  # (id of the ruleset, names removed) -> (the ruleset, the copy without them)
_derived_lock = threading.Lock()


def without(runs: list, disabled) -> list:
    """``runs`` ((RuleSet, iterations) pairs) minus what ``disabled`` names: rule names, ruleset names or families.
    A ruleset left with some of its rules becomes a copy without the others, paired with its own count.

    Raises ConfigError for a name that is none of these, listing the families and rulesets (and
    rule names close to it). The same rulesets and names give the same objects back, so the
    e-graph engine compiled for them is reused.
    """
    disabled = set(disabled)
    if not disabled:
        return list(runs)
    rulesets = [rs for rs, _ in runs]
    families = {ruleset_family(rs.name) for rs in rulesets}
    names = {rs.name for rs in rulesets}
    rules = {r.name for rs in rulesets for r in rs.rules}
    unknown = sorted(disabled - families - names - rules)
    if unknown:
        close = sorted({m for n in unknown for m in difflib.get_close_matches(n, rules | names | families, n=3)})
        raise ConfigError(
            f"config.rules.disabled names {unknown}, which are no rule family, ruleset or rule; families: "
            f"{sorted(families)}; rulesets: {sorted(names)}; rules: the {len(rules)} names `python -m rewrite rules` "
            f"lists" + (f" (close: {close})" if close else ""))
    out = []
    for rs, iterations in runs:
        if rs.name in disabled or ruleset_family(rs.name) in disabled:
            continue
        removed = frozenset(r.name for r in rs.rules if r.name in disabled)
        if not removed:
            out.append((rs, iterations))
            continue
        key = (id(rs), removed)
        with _derived_lock:
            entry = _derived.get(key)
            if entry is None or entry[0] is not rs:
                entry = _derived[key] = (rs, dataclasses.replace(rs, rules=[r for r in rs.rules if r.name not in removed]))
        out.append((entry[1], iterations))
    return out
