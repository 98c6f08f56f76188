"""DSL rules -> egglog rule commands.

A pattern becomes a query over `Call` terms whose op nodes all share one stream variable (a rule
never combines work of two streams); conditions become atoms over the dtype/shape/sizes/splat
analyses. The replacement is guarded by the meta of the matched e-class:

* a variable replacement is unioned only where its meta equals the matched expression's;
* an op replacement is built and recorded as ``(Pending matched replacement)``; Python infers the
  meta of the new e-classes and the ``accept`` ruleset unions the pair when the metas agree.
"""
from __future__ import annotations

from ..dsl import Condition, Lit, OpPattern, Rule, RuleError, RuleSet, Var, dtype_str, shape_key, splat_key, target_name
from .terms import Tables, float_key, list_term, quote

STREAM = "__stream"
ROOT = "__root"


class _Names:
    """Fresh egglog variable names for pattern variables (egglog vars are plain identifiers)."""

    def __init__(self):
        self.map: dict[str, str] = {}

    def var(self, name: str) -> str:
        return self.map.setdefault(name, f"v_{name}")


def _pattern_term(p, names: _Names, tables: Tables) -> str:
    if isinstance(p, Var):
        return names.var(p.name)
    if isinstance(p, OpPattern):
        items = [_pattern_term(a, names, tables) for a in list(p.args) + list(p.kwargs.values())]
        return f"(Call {quote(target_name(p.target))} {list_term(items)} {STREAM})"
    if isinstance(p, Lit):
        return _pattern_term(p.value, names, tables)
    if isinstance(p, list):
        return f"(Lst {list_term([_pattern_term(a, names, tables) for a in p])})"
    if isinstance(p, tuple):
        return f"(Tup {list_term([_pattern_term(a, names, tables) for a in p])})"
    if isinstance(p, bool) or p is None:
        return tables.atom(p)
    if isinstance(p, int):
        return f"(Int {p})"
    if isinstance(p, float):
        return f'(Flt "{float_key(p)}")'
    return tables.atom(p)


class RuleCompiler:
    """Turns rulesets into egglog program text; remembers the dtype sets it declared."""

    def __init__(self, tables: Tables):
        self.tables = tables
        self.dtype_sets: dict[tuple, str] = {}
        self.declarations: list[str] = []

    def _dtype_set(self, dtypes: tuple) -> str:
        key = tuple(sorted(dtype_str(d) for d in dtypes))
        if key not in self.dtype_sets:
            rel = f"dtypes_{len(self.dtype_sets)}"
            self.dtype_sets[key] = rel
            self.declarations.append(f"(relation {rel} (String))")
            self.declarations.extend(f"({rel} {quote(d)})" for d in key)
        return self.dtype_sets[key]

    def _condition(self, c: Condition, names: _Names) -> list[str]:
        vs = [names.var(v.name) if isinstance(v, Var) else None for v in c.vars]
        if c.kind == "dtype_in":
            return [f"({self._dtype_set(c.arg)} (dtype {vs[0]}))"]
        if c.kind == "same_dtype":
            return [f"(= (dtype {vs[0]}) (dtype {vs[1]}))"]
        if c.kind == "same_shape":
            return [f"(= (shape {vs[0]}) (shape {vs[1]}))"]
        if c.kind == "shape_is":
            other = c.vars[1]
            if isinstance(other, Var):
                return [f"(= (shape {vs[0]}) (sizes {vs[1]}))"]
            return [f"(= (shape {vs[0]}) {quote(shape_key(other.value))})"]
        if c.kind == "rank_is":
            return [f"(= (rank {vs[0]}) {c.arg})"]
        if c.kind == "value_is":
            return [f"(= (splat {vs[0]}) {quote(splat_key(c.arg))})"]
        raise RuleError(f"condition {c!r}: kind {c.kind!r} cannot be compiled to the e-graph")

    def compile_rule(self, r: Rule, ruleset: str) -> str:
        if r.is_computed:
            raise RuleError(f"rule {r.name} has a computed replacement; it runs on the IR, not in egglog")
        names = _Names()
        lhs = _pattern_term(r.lhs, names, self.tables)
        facts = [f"(= {ROOT} {lhs})"]
        for c in r.when:
            facts.extend(self._condition(c, names))
        rhs = r.rhs
        if isinstance(rhs, Var):
            target = names.var(rhs.name)
            facts.append(f"(= (meta {ROOT}) (meta {target}))")
            action = f"(union {ROOT} {target})"
        else:
            action = f"(Pending {ROOT} {_pattern_term(rhs, names, self.tables)})"
        name = r.name.replace('"', "'")
        return f"(rule ({' '.join(facts)}) ({action}) :ruleset {ruleset} :name {quote(ruleset + '/' + name)})"

    def compile_ruleset(self, rs: RuleSet) -> tuple[str, list[str]]:
        """(egglog ruleset name, commands declaring it and its rules)."""
        egg_name = "rs_" + "".join(ch if ch.isalnum() else "_" for ch in rs.name)
        cmds = [f"(ruleset {egg_name})"]
        for r in rs.pattern_rules:
            cmds.append(self.compile_rule(r, egg_name))
        return egg_name, cmds
