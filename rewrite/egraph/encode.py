"""Rules -> egglog rule commands: what the engine means by a rule. All egglog text of rules is written here.

The engine does not know the rule DSL's classes: a ruleset gives its ``name`` and ``pattern_rules``, and
each rule its plain data (``rule.data()``, `rewrite.dsl.rulesets.RuleData`): ``name``; ``lhs``, the left
sides (one per operand order; one per member for a ``siblings`` rule); ``variables``; ``conditions``;
``rhs``; ``same_meta``. A pattern is ``("var", name)``, ``("call", op name, items)``, ``("list", items)``,
``("tuple", items)`` or ``("lit", value)``; it becomes a term over fresh variables of a `RuleScope`
(`RuleScope.term`). A condition is ``(kind, variable name, *operands)``; it becomes atoms over the
dtype/shape/sizes/splat analyses (`RuleCompiler.atoms`, one function per kind in `CONDITION_ATOMS`).
`RuleCompiler.rule` turns the pieces into egglog rules with the engine's guard.

A pattern's op nodes all share one stream variable (a rule never combines work of two streams).
The replacement is guarded by the meta of the matched e-class:

* a variable replacement is unioned only where its meta equals the matched expression's;
* an op replacement is built and recorded as ``(Pending matched replacement)`` (and in the rule's
  own ``pending_<k>`` relation); Python infers the meta of the new e-classes and the rule's
  ``accept`` rule unions the pair when the metas agree.

A rule's firings (``num_matches`` under its name) are thus replacements that passed the guard:
the variable rule's query holds the guard, and an op rule's count is that of its accept rule
(its own match, named ``...#pending``, only proposes the replacement).
"""
from __future__ import annotations

import re

from ..ops import shape_key, splat_key
from .terms import Tables, call_term, float_key, list_term, quote

STREAM = "__stream"
ROOT = "__root"
MATCH_SUFFIX = "#match"      # names of the structural first stage (not counted as firings)
PENDING_SUFFIX = "#pending"  # an op replacement proposed, not yet accepted (not counted either)
CONDITIONS_PER_STAGE = 8  # a multi-pattern rule's side conditions per egglog rule (see Compiler.multi_rule)
_VARIABLE = re.compile(r"(?<![\w\"])((?:v_|__)\w+)")


def _private_variables_stay_in_their_stage(stages: list[list[str]], columns: set, rhs: list[str]) -> bool:
    """Whether every variable a stage introduces (not a column of the match relations) is used in that
    stage alone and not by the replacements: only then can the stages be separate rules."""
    home: dict = {}
    for k, stage in enumerate(stages):
        for name in {v for atom in stage for v in _VARIABLE.findall(atom)} - columns:
            if home.setdefault(name, k) != k:
                return False
    used = {v for term in rhs for v in _VARIABLE.findall(term)}
    return not (used & set(home))


class RuleScope:
    """Fresh egglog variable names for one rule's pattern variables and op streams.

    Every op node of a pattern gets its own stream variable; the first is the root's. They are
    required equal only in the second stage: a stream variable shared inside the structural
    query is a join key that matches every node (all share the default stream) and egglog's
    planner may start from it, which made matching quadratic in the graph size.
    """

    def __init__(self, tables: Tables):
        self.tables = tables
        self.map: dict[str, str] = {}
        self.streams: list[str] = []

    def var(self, name: str) -> str:
        return self.map.setdefault(name, f"v_{name}")

    def stream(self) -> str:
        self.streams.append(STREAM if not self.streams else f"{STREAM}{len(self.streams)}")
        return self.streams[-1]

    # -- terms: what a pattern's pieces look like inside the e-graph ---------------------------
    def call(self, op_name: str, items: list[str], rhs: bool) -> str:
        """A call term; on the right side every new op takes the root's stream."""
        return call_term(op_name, items, STREAM if rhs else self.stream())

    def literal(self, value) -> str:
        if isinstance(value, bool) or value is None:
            return self.tables.atom(value)
        if isinstance(value, int):
            return f"(Int {value})"
        if isinstance(value, float):
            return f'(Flt "{float_key(value)}")'
        return self.tables.atom(value)

    @staticmethod
    def sequence(items: list[str], is_list: bool) -> str:
        return f"({'Lst' if is_list else 'Tup'} {list_term(items)})"

    def term(self, pattern, rhs: bool = False) -> str:
        """The egglog term of a pattern's data (inner calls take their streams first)."""
        kind = pattern[0]
        if kind == "var":
            return self.var(pattern[1])
        if kind == "call":
            return self.call(pattern[1], [self.term(a, rhs) for a in pattern[2]], rhs)
        if kind in ("list", "tuple"):
            return self.sequence([self.term(a, rhs) for a in pattern[1]], kind == "list")
        if kind == "lit":
            return self.literal(pattern[1])
        raise ValueError(f"unknown pattern kind {kind!r} in {pattern!r}")


# Condition data -> query atoms: one function per kind, called as ``(compiler, scope, *operands)``.
# Variables come by their DSL name (``scope.var`` gives the egglog one), the rest as plain values.

def _dims_index(rank: str, i: int) -> str:
    return str(i) if i >= 0 else f"(+ {rank} {i})"


def _dtype_in(compiler, scope, x, dtype_names):
    return [f"({compiler.dtype_set(dtype_names)} (dtype (meta {scope.var(x)})))"]


def _same(compiler, scope, analysis, x, y):
    a, b = scope.var(x), scope.var(y)
    return [f"(= ({analysis} (meta {a})) ({analysis} (meta {b})))"]


def _shape_is(compiler, scope, x, sizes):
    """``sizes``: the name of a variable bound to a size list, or a literal tuple of ints."""
    if isinstance(sizes, str):
        return [f"(= (shape (meta {scope.var(x)})) (sizes {scope.var(sizes)}))"]
    return [f'(= (shape (meta {scope.var(x)})) "{shape_key(list(sizes))}")']


def _dims_agree(compiler, scope, x_name, i, y_name, j):
    x, y = scope.var(x_name), scope.var(y_name)
    if i < 0 or j < 0:  # index from the end: through the rank
        ri, rj = scope.var(f"_rank_{x_name}"), scope.var(f"_rank_{y_name}")
        return [f"(= {ri} (rank (meta {x})))", f"(= {rj} (rank (meta {y})))",
                f"(= (dim (meta {x}) {_dims_index(ri, i)}) (dim (meta {y}) {_dims_index(rj, j)}))"]
    return [f"(= (dim (meta {x}) {i}) (dim (meta {y}) {j}))"]


def _dim_is(compiler, scope, x_name, i, size):
    x = scope.var(x_name)
    if i >= 0:
        return [f'(= (dim (meta {x}) {i}) "{size}")']
    rank = scope.var(f"_rank_{x_name}")
    return [f"(= {rank} (rank (meta {x})))", f'(= (dim (meta {x}) (+ {rank} {i})) "{size}")']


def _uniform(compiler, scope, x, excluded):
    value = scope.var(f"_splat_{x}")
    return [f"(= {value} (splat {scope.var(x)}))"] + [f'(!= {value} "{splat_key(v)}")' for v in excluded]


CONDITION_ATOMS = {
    "dtype_in": _dtype_in,  # (x, dtype names)
    "same": _same,  # ("dtype" | "shape", x, y): both agree on that analysis
    "shape_is": _shape_is,  # (x, size-list variable name | tuple of ints)
    "dims_agree": _dims_agree,  # (x, i, y, j)
    "dim_is": _dim_is,  # (x, i, size)
    "rank_is": lambda compiler, scope, x, rank: [f"(= (rank (meta {scope.var(x)})) {rank})"],
    "value_is": lambda compiler, scope, x, value: [f'(= (splat {scope.var(x)}) "{splat_key(value)}")'],
    "on_device": lambda compiler, scope, x, device: [f'(= (device (meta {scope.var(x)})) "{device}")'],
    "is_scalar": lambda compiler, scope, x: [f"(Scalar {scope.var(x)})"],
    # (x, ((op name, canonical arity), ...))
    "made_by": lambda compiler, scope, x, ops: [f"({compiler.made_by(list(ops))} {scope.var(x)})"],
    "uniform": _uniform,  # (x, excluded values)
    "is_const": lambda compiler, scope, x: [f"(= {scope.var(x)} (Const {scope.var(f'_const_{x}')}))"],
}


class RuleCompiler:
    """Turns rulesets into egglog program text; remembers the relations it declared."""

    def __init__(self, tables: Tables):
        self.tables = tables
        self.dtype_sets: dict[tuple, str] = {}
        self.producer_sets: dict[tuple, str] = {}
        self.declarations: list[str] = []
        self.counter = 0

    def scope(self) -> RuleScope:
        return RuleScope(self.tables)

    def dtype_set(self, dtype_names) -> str:
        """A relation holding the dtypes named ``dtype_names``, declared once per distinct set."""
        key = tuple(sorted(dtype_names))
        if key not in self.dtype_sets:
            rel = f"dtypes_{len(self.dtype_sets)}"
            self.dtype_sets[key] = rel
            self.declarations.append(f"(relation {rel} (String))")
            self.declarations.extend(f"({rel} {quote(d)})" for d in key)
        return self.dtype_sets[key]

    def made_by(self, ops: list[tuple[str, int]]) -> str:
        """A relation holding the e-classes some call of ``ops`` ((name, canonical arity) pairs)
        computes; declared once per distinct set, filled by rules of the ``facts`` ruleset."""
        key = tuple(sorted(ops))
        if key not in self.producer_sets:
            rel = f"made_{len(self.producer_sets)}"
            self.producer_sets[key] = rel
            self.declarations.append(f"(relation {rel} (Term))")
            for name, arity in key:
                term = call_term(name, [f"__a{i}" for i in range(arity)], "__s")
                self.declarations.append(f"(rule ((= __t {term})) (({rel} __t)) :ruleset facts)")
        return self.producer_sets[key]

    def rule(self, ruleset: str, name: str, scope: RuleScope, lhs: str | list[str], variables: list[str],
             conditions: list[str], rhs: str, rhs_is_var: bool, same_meta: bool = False) -> list[str]:
        """Two egglog rules: match the structure, then check conditions on the (few) matches.

        One rule holding both the pattern and the conditions lets egglog's planner start from
        the analysis tables and join them with the op table: measured 17 s for a 1,000-node
        graph, against 2 ms for the two-stage form. ``same_meta``: the replacement's meta is the
        matched one's by construction (operands of a pointwise op swapped), so it is unioned at
        once instead of waiting for Python to infer its meta (commutativity doubles every add
        and mul: inferring those metas was most of a large graph's saturation time). A list
        ``lhs``: alternative structural matches (a rule's operand orders) filling one match relation.
        """
        rule_name = ruleset + "/" + name.replace('"', "'")
        first, *others = [lhs] if isinstance(lhs, str) else lhs  # others: the same pattern, operands swapped
        match_row, stage1 = self._match([ROOT], [f"(= {ROOT} {first})"], variables, scope, ruleset, rule_name)
        stage1 = "\n".join([stage1] + [f"(rule ((= {ROOT} {term})) ({match_row}) :ruleset {ruleset} "
                                       f":name {quote(f'{rule_name}#{i}{MATCH_SUFFIX}')})"
                                       for i, term in enumerate(others, 2)])
        facts = [match_row] + [f"(= {STREAM} {s})" for s in scope.streams[1:]] + conditions
        if rhs_is_var or same_meta:
            if rhs_is_var:
                facts.append(f"(= (meta {ROOT}) (meta {rhs}))")
            stage2 = f"(rule ({' '.join(facts)}) ((union {ROOT} {rhs})) :ruleset {ruleset} :name {quote(rule_name)})"
            return [stage1, stage2]
        return [stage1, *self._propose(ruleset, rule_name, facts, [(ROOT, rhs)])]

    def multi_rule(self, ruleset: str, name: str, scope: RuleScope, lhs: list[str], variables: list[str],
                   conditions: list[str], rhs: list[str]) -> list[str]:
        """A ``siblings(...)`` rule: member i of the left side is replaced by ``rhs[i]``.

        The guard that keeps it from exploding: every member is the e-class of an original IR node
        (it has a ``Ref``; terms that rules create have none, so a merged GEMM is never a member
        again) and members are ordered by their node index (each set of siblings matches once).
        The side conditions are checked in stages of at most `CONDITIONS_PER_STAGE` atoms, each stage a
        rule from the last one's relation to the next: one query holding all of the three-GEMM merge's
        ~35 conditions took egglog 50 s per run on MobileViT's graph (time outside the rules' search
        and apply, which it reported as 49 ms), 9 s for the whole compile without the rule.
        """
        rule_name = ruleset + "/" + name.replace('"', "'")
        roots = [f"{ROOT}{i}" for i in range(len(lhs))]
        refs = [f"__ref{i}" for i in range(len(lhs))]
        query = ([f"(= {r} {t})" for r, t in zip(roots, lhs)] + [f"(= {r} (Ref {k}))" for r, k in zip(roots, refs)]
                 + [f"(< {a} {b})" for a, b in zip(refs, refs[1:])]
                 + [f"(!= {a} {b})" for i, a in enumerate(roots) for b in roots[i + 1:]])
        row, stage1 = self._match(roots, query, variables, scope, ruleset, rule_name)
        rules = [stage1]
        facts = [f"(= {STREAM} {s})" for s in scope.streams[1:]] + conditions
        stages = [facts[i:i + CONDITIONS_PER_STAGE] for i in range(0, len(facts), CONDITIONS_PER_STAGE)]
        if _private_variables_stay_in_their_stage(stages, set(roots + variables + scope.streams), rhs):
            for k, stage in enumerate(stages[:-1]):
                row, checked = self._match(roots, [row, *stage], variables, scope, ruleset, f"{rule_name}#conditions{k}")
                rules.append(checked)
            facts = stages[-1] if stages else []
        return rules + self._propose(ruleset, rule_name, [row, *facts], list(zip(roots, rhs)))

    def _match(self, roots: list[str], query: list[str], variables: list[str], scope: RuleScope, ruleset: str,
               rule_name: str) -> tuple[str, str]:
        """Stage one: a relation of structural matches (roots, variables, streams) and the rule filling it."""
        self.counter += 1
        match_rel = f"match_{self.counter}"
        cols = roots + variables
        self.declarations.append(f"(relation {match_rel} ({'Term ' * len(cols)}{'String ' * len(scope.streams)}))")
        row = f"({match_rel} {' '.join(cols + scope.streams)})"
        return row, f"(rule ({' '.join(query)}) ({row}) :ruleset {ruleset} :name {quote(rule_name + MATCH_SUFFIX)})"

    def _propose(self, ruleset: str, rule_name: str, facts: list[str], pairs: list[tuple[str, str]]) -> list[str]:
        """Stage two for op replacements: build each replacement and record (matched, new) as
        pending; the accept rule unions a pair once Python has inferred equal metas for it."""
        pending = f"pending_{self.counter}"
        self.declarations.append(f"(relation {pending} (Term Term))")
        actions = " ".join(f"(let __new{i} {rhs}) (Pending {root} __new{i}) ({pending} {root} __new{i})"
                           for i, (root, rhs) in enumerate(pairs))
        stage2 = (f"(rule ({' '.join(facts)}) ({actions}) :ruleset {ruleset} "
                  f":name {quote(rule_name + PENDING_SUFFIX)})")
        accept = (f"(rule (({pending} a b) (= (meta a) (meta b)) (!= a b)) ((union a b)) "
                  f":ruleset accept :name {quote(rule_name)})")
        return [stage2, accept]

    def atoms(self, scope: RuleScope, condition: tuple) -> list[str]:
        """The query atoms of one condition's data ``(kind, *operands)``."""
        kind, *operands = condition
        if kind not in CONDITION_ATOMS:
            raise ValueError(f"unknown condition kind {kind!r} in {condition!r}")
        return CONDITION_ATOMS[kind](self, scope, *operands)

    def compile_rule(self, rule, ruleset: str) -> list[str]:
        """The egglog rules of one pattern rule's data (see the module docstring)."""
        scope = self.scope()
        if rule.siblings:
            lhs = [scope.term(p) for p in rule.lhs]
        else:  # every operand order is a structural match of its own (same variables, its own streams)
            lhs = [scope.term(rule.lhs[0])] + [self.scope().term(p) for p in rule.lhs[1:]]
        variables = [scope.var(v) for v in rule.variables]
        conditions = [atom for c in rule.conditions for atom in self.atoms(scope, c)]
        if rule.siblings:
            rhs = [scope.term(p, rhs=True) for p in rule.rhs]
            return self.multi_rule(ruleset, rule.name, scope, lhs, variables, conditions, rhs)
        return self.rule(ruleset, rule.name, scope, lhs[0] if len(lhs) == 1 else lhs, variables, conditions,
                         scope.term(rule.rhs, rhs=True), rule.rhs[0] == "var", same_meta=rule.same_meta)

    def compile_ruleset(self, rs) -> tuple[str, list[str]]:
        """(egglog ruleset name, commands declaring it and its rules) of a ruleset object.

        ``rs`` has a ``name`` and ``pattern_rules``, each with ``data()``: the rule as plain data.
        """
        egg_name = "rs_" + "".join(ch if ch.isalnum() else "_" for ch in rs.name)
        cmds = [f"(ruleset {egg_name})"]
        for r in rs.pattern_rules:
            cmds.extend(self.compile_rule(r.data(), egg_name))
        return egg_name, cmds
