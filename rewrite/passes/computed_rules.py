"""Rules with computed replacements, applied by a small Python matcher on the IR.

A computed rule (``rule(lhs, fn, when=...)``) cannot run inside egglog: its right side is Python.
It runs between saturation rounds: for each node matching ``lhs`` (all matched ops on one stream)
whose conditions hold, ``fn(**binding)`` is called with constants as their values and other nodes
as their metas (``TensorMeta``/``SymMeta``). ``fn`` returns None (no rewrite), a tensor or
Python scalar (becomes a constant), or a pattern over the rule's variables (built as new nodes on
the matched node's stream). A replacement is used only if its meta equals the matched node's.
"""
from __future__ import annotations

import logging

import torch

from ..dsl import Lit, OpPattern, Pattern, Rule, RuleSet, Var, same_value
from ..egraph.load import must_pin
from ..ir import Graph, Node, map_nodes, meta_of_value, same_meta
from ..ops import OpError, canonical_call
from ..shape import infer_meta
from .pass_type import Pass, Step

log = logging.getLogger("rewrite")

__all__ = ["COMPUTED_RULES", "apply_computed_rules", "match_node"]


def match_node(p, value, binding: dict, stream) -> bool:
    """Match pattern ``p`` against an IR value (Node or Python value), extending ``binding``.

    Literals compare as in the DSL (`rewrite.dsl.same_value`: typed, -0.0 is not 0.0)."""
    if isinstance(p, Var):
        if p.name in binding:
            return same_value(binding[p.name], value)  # nodes have no value equality: by identity
        binding[p.name] = value
        return True
    if isinstance(p, OpPattern):
        if not isinstance(value, Node) or value.kind != "call" or value.target is not p.target:
            return False
        if value.stream != stream or must_pin(value):
            return False
        try:
            args, kwargs = canonical_call(value.target, value.args, value.kwargs)
        except OpError:
            return False
        if len(args) != len(p.args) or set(kwargs) != set(p.kwargs):
            return False
        return (all(match_node(a, v, binding, stream) for a, v in zip(p.args, args))
                and all(match_node(a, kwargs[k], binding, stream) for k, a in p.kwargs.items()))
    if isinstance(p, Lit):
        return match_node(p.value, value, binding, stream)
    if isinstance(p, (list, tuple)):
        return (isinstance(value, (list, tuple)) and len(value) == len(p)
                and all(match_node(a, v, binding, stream) for a, v in zip(p, value)))
    return same_value(p, value)  # a Node is never equal to a literal


def _concrete(v):
    """What conditions and computed replacements see: constant values, otherwise metas."""
    if isinstance(v, Node):
        return v.value if v.kind == "constant" else v.meta
    if isinstance(v, (list, tuple)):
        return type(v)(_concrete(x) for x in v)
    return v


def _build(p, binding: dict, graph: Graph, before: Node, stream):
    """Materialize a replacement pattern as IR nodes (inserted before ``before``)."""
    if isinstance(p, Var):
        return binding[p.name]
    if isinstance(p, Lit):
        return _build(p.value, binding, graph, before, stream)
    if isinstance(p, OpPattern):
        args = [_build(a, binding, graph, before, stream) for a in p.args]
        kwargs = {k: _build(a, binding, graph, before, stream) for k, a in p.kwargs.items()}
        meta_of = lambda n: n.meta  # noqa: E731
        meta = infer_meta(p.target, map_nodes(args, meta_of), map_nodes(kwargs, meta_of), graph.symbols)
        return graph.call(p.target, args, kwargs, meta=meta, before=before, stream=stream)
    if isinstance(p, list):
        return [_build(a, binding, graph, before, stream) for a in p]
    if isinstance(p, tuple):
        return tuple(_build(a, binding, graph, before, stream) for a in p)
    return p


def apply_computed_rules(graph: Graph, rulesets: list[RuleSet]) -> dict[str, int]:
    """One pass of every computed rule over the graph; returns rule name -> times applied."""
    rules: dict[object, list[Rule]] = {}
    for rs in rulesets:
        for r in rs.computed_rules:
            rules.setdefault(r.lhs.target, []).append(r)
    fired: dict[str, int] = {}
    if not rules:
        return fired
    waited = graph.waited_on()
    # by target identity (what the dict's lookup meant): hashing an OpOverload runs Python code
    by_target = {id(t): (t, rs) for t, rs in rules.items()}
    for node in list(graph.nodes):
        entry = by_target.get(id(node.target))
        if (node.kind != "call" or entry is None or entry[0] is not node.target or node.id in waited
                or node.graph is not graph):
            continue
        for r in entry[1]:
            binding: dict = {}
            stream = node.stream
            if not match_node(r.lhs, node, binding, stream):
                continue
            concrete = {k: _concrete(v) for k, v in binding.items()}
            try:
                if not r.conditions_hold(concrete):
                    continue
                result = r.rhs(**concrete)
            except Exception as e:  # noqa: BLE001 - a failing rule is skipped, not fatal
                log.debug("computed rule %s failed on %s: %s", r.name, node.name, e)
                continue
            new = _replacement(result, binding, graph, node, stream)
            if new is None:
                continue
            graph.replace_all_uses(node, new)
            fired[r.name] = fired.get(r.name, 0) + 1
            break
    if fired:
        graph.prune()
    return fired


def _run(step: Step) -> dict:
    """The computed rules of every ruleset the unit is offered (the library's, the user's, minus the disabled)."""
    return apply_computed_rules(step.graph, [rs for rs, _ in step.runs])


COMPUTED_RULES = Pass("computed_rules", "computed_rules", _run,
                      "DSL rules with computed (Python) replacements, matched on the IR")


def _replacement(result, binding, graph: Graph, node: Node, stream):
    if result is None:
        return None
    if isinstance(result, Pattern):
        try:
            new = _build(result, binding, graph, node, stream)
        except Exception as e:  # noqa: BLE001
            log.debug("computed replacement for %s could not be built: %s", node.name, e)
            return None
        ok = isinstance(new, Node) and same_meta(new.meta, node.meta)
        if not ok:
            graph.prune()
        return new if ok else None
    if isinstance(result, torch.Tensor) or isinstance(result, (int, float, bool)):
        meta = meta_of_value(result)
        if not same_meta(meta, node.meta):
            return None
        return graph.constant(result, meta, before=node)
    return None
