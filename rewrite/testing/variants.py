"""Several different graphs that compute the same values: the e-graph run backwards, for testing compilers.

rewrite's e-graph holds, after saturation, every form of a graph its rules can reach; the optimizer
takes the cheapest. A compiler under test is better served by many of them: a miscompilation often
lives in one form only (an operand order its pattern matcher did not expect, a ``t(t(x))`` it folds
wrongly, a merged GEMM it splits badly). PolyJuice (OOPSLA'24) found 84 miscompilations in five
compilers that way. `equivalent_variants` saturates a graph once with the rule library and extracts
several graphs from it (`rewrite.egraph.extract.extract_variant`): the cheapest, the costliest (every
e-class at its most expensive acyclic e-node, and wrapped once in an identity form such as ``x * 1``),
and random picks, each a plain IR graph that `rewrite.fx_bridge.to_fx` turns back into a function.

Rules: ``rules="exact"`` (the default) uses only exact rules (each checked bit for bit by
`check_rule`), so every variant computes bit for bit what the original computes; ``rules="all"``
adds the inexact ones (``exact=False``: a fused kernel, a scale folded into a weight), whose
variants agree within the dtype's tolerance on finite inputs of moderate size (`rewrite.dsl.in_domain`).
"""
from __future__ import annotations

import dataclasses
import threading

from ..passes.boundary import keep_outputs_fresh, views_as_reshapes
from ..egraph import Limits, equivalent_graphs
from ..ir import Graph
from ..optimizer import egraph_unsupported, library_runs

__all__ = ["Variant", "equivalent_variants", "variant_rulesets", "variant_picks", "RULE_CHOICES"]

RULE_CHOICES = ("exact", "all")
# Saturation limits for variants: small graphs saturate in well under a second; a zoo graph is cut
# off by the time limit and its variants come from what saturation reached by then.
VARIANT_LIMITS = Limits(node_limit=100_000, time_limit_s=20.0, iteration_limit=12)

_rulesets: dict = {}
_lock = threading.Lock()


def variant_rulesets(rules: str = "exact") -> list:
    """The library's rulesets for variants, as (RuleSet, iterations) pairs run as the optimizer's schedule
    runs them: exact rules only, or all of them. The same objects every call, so the e-graph engine compiled
    for them is reused (`rewrite.egraph.engine_for`)."""
    if rules not in RULE_CHOICES:
        raise ValueError(f"rules={rules!r}: use 'exact' (bit-for-bit rules only) or 'all' (inexact rules too, "
                         "compared within tolerance)")
    with _lock:
        if rules not in _rulesets:
            if rules == "all":
                _rulesets[rules] = library_runs()
            else:
                kept = [(dataclasses.replace(rs, rules=[r for r in rs.rules if r.exact]), k) for rs, k in library_runs()]
                _rulesets[rules] = [(rs, k) for rs, k in kept if rs.rules]
        return _rulesets[rules]


def variant_picks(count: int, seed: int = 0) -> list[tuple[str, int]]:
    """``count`` extraction picks: the cheapest, the costliest, then random ones (seeds from ``seed``)."""
    if count < 1:
        raise ValueError(f"variants={count} must be at least 1")
    picks = [("cheapest", 0), ("costliest", 0)][:count]
    picks += [("random", seed * 1000 + k) for k in range(count - len(picks))]
    return picks


@dataclasses.dataclass
class Variant:
    """One graph of equal value: how it was picked (``original``, ``cheapest``, ``costliest``,
    ``random-<seed>``) and the graph."""

    label: str
    graph: Graph

    def __repr__(self):
        return f"Variant({self.label}, {self.graph.num_ops()} ops)"


def _signature(graph: Graph) -> str:
    """What tells two variants apart: their FX code (node names are those to_fx derives from ops)."""
    from ..fx_bridge import to_fx

    return to_fx(graph).code


def equivalent_variants(graph: Graph, variants: int = 4, rules: str = "exact", seed: int = 0,
                        include_original: bool = True, limits: Limits | None = None) -> tuple[list[Variant], str]:
    """Up to ``variants`` different graphs equal in value to ``graph`` (after the original itself when
    ``include_original``), and a note on how they were made.

    Picks as `variant_picks`; variants whose FX code is the same as an earlier one are dropped, so
    fewer may come back (a graph no rule applies to has only itself). A graph the e-graph cannot
    take (`rewrite.optimizer.egraph_unsupported`: a mutation before other ops, an op that reads
    strides) gives the original alone and the note says why.
    """
    out = [Variant("original", graph)] if include_original else []
    seen = {_signature(graph)} if include_original else set()
    why = egraph_unsupported(graph)
    if why:
        return out, f"no variants: the e-graph cannot take this graph ({why})"
    picks = variant_picks(variants, seed)
    graphs, result = equivalent_graphs(graph, variant_rulesets(rules), limits or VARIANT_LIMITS, picks)
    for (pick, pick_seed), g in zip(picks, graphs):
        g.prune()
        # The optimizer's boundary fixes, as after its own extraction: the e-graph equates values,
        # not memory (max(x, x) -> x must not hand the caller its input; a view may now read another layout).
        views_as_reshapes(g)
        keep_outputs_fresh(graph, g)
        sig = _signature(g)
        if sig in seen:
            continue
        seen.add(sig)
        out.append(Variant(pick if pick != "random" else f"random-{pick_seed}", g))
    fired = sum(result.fired.values())
    note = (f"{len(out) - include_original} different variant(s) of {len(picks)} picks; saturation: "
            f"{fired} rule firings, {result.rounds} round(s)"
            + (f", stopped by the {result.stopped_by}" if result.stopped_by else ""))
    return out, note
