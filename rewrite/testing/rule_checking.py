"""Is a rewrite rule sound? Draw random instances of its left side and compare both sides bit for bit.

A rule is a claim about every value its pattern can match, so the checker instantiates the pattern
itself rather than waiting for a graph to contain it: each variable gets a shape, dtype, layout and
values (NaN, -0.0, extreme integers...) that fit the op's schema and the rule's own conditions
(each condition says what it needs through ``hint``), then both sides run on the same binding and
must agree to the bit (NaN matches NaN, -0.0 must stay -0.0). A rule that matches several
operand orders (``x * c`` and ``c * x``) is checked in each. A failure prints the shrunk
counterexample. ``python -m rewrite check-rules MODULE`` runs `check_ruleset_module`.
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
import math
from typing import Any, Sequence

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ..dsl import OpPattern, Rule, RuleSet, Var
from ..ops import dtype_str, schema_types
from .equivalence import compare_outputs as compare_results, input_aliases
from .strategies import (
    ALL_DTYPES, FLOAT_DTYPES, INT_DTYPES, MAX_RANK, draw_dim, permutations_of, reshapes, shapes, tensors,
)

log = logging.getLogger("rewrite")

# Values a scalar or splat-constant operand is drawn from: identities, absorbing elements and the
# signed zeros that separate a sound rule from an almost-sound one.
SCALAR_CANDIDATES = (0, 1, -1, 2, 0.0, -0.0, 1.0, -1.0, 2.0, 0.5, math.inf, math.nan, True, False)


# Schema arguments typed as plain ints in the schema but holding enums: passing a random int
# there crashes the kernel, so they are drawn from their real values.
_ENUM_ARGUMENTS = {
    "memory_format": [None, torch.contiguous_format, torch.preserve_format],
    "layout": [None, torch.strided],
    "device": [None, torch.device("cpu")],
    "pin_memory": [None, False],
}


_TENSOR = object()  # "draw a tensor here" (None is a real value of optional arguments)


def _float_only(value) -> bool:
    """Whether ``value`` exists only as a float (-0.0, 0.5, inf...), not as an integer too."""
    return isinstance(value, float) and (not value.is_integer() or math.copysign(1, value) < 0)


class _Invalid(Exception):
    """This random instance does not fit the pattern (the left side raised, or a condition failed)."""


def _condition_hints(rule) -> dict[str, dict]:
    """What the rule's own conditions say about each variable, to draw instances that satisfy them."""
    hints: dict[str, dict] = {}
    for c in rule.when:
        c.hint(hints)
    return hints


class _Instantiator:
    """Builds one random instance of a pattern: binds every variable to a concrete value.

    Tensor variables get random shapes, dtypes allowed by the rule's conditions, values with NaN,
    inf, -0.0 and extreme integers, and sometimes a non-contiguous or expanded layout. Size, dim
    and permutation arguments are drawn to fit the tensor they apply to, biased towards the
    shapes already in the instance (so ``shape_is`` conditions hold often enough).
    """

    def __init__(self, draw, rule, dtypes: Sequence[torch.dtype]):
        self.draw = draw
        self.rule = rule
        self.dtypes = tuple(dtypes)
        self.hints = _condition_hints(rule)
        self.binding: dict[str, Any] = {}
        self.shapes_seen: list[tuple] = []
        # An inexact rule is compared only inside its domain (`rewrite.dsl.in_domain`: no infinities): with
        # NaN/inf/extremes in each of its tensors few instances would be (5 of 89 for a batch-norm folding with
        # six tensors), so most of its instances draw plain values. Exact rules draw as before.
        self.specials = rule.exact or draw(st.integers(0, 3)) == 0

    # -- tensors ---------------------------------------------------------------------------------
    def tensor(self, name: str, like: torch.Tensor | None) -> torch.Tensor:
        draw, h = self.draw, self.hints.get(name, {})
        value = h.get("value")
        if h.get("dtype_like") in self.binding and isinstance(self.binding[h["dtype_like"]], torch.Tensor):
            dtype = self.binding[h["dtype_like"]].dtype
        elif h.get("dtypes"):
            dtype = draw(st.sampled_from(h["dtypes"]))
        elif _float_only(value):
            dtype = draw(st.sampled_from(FLOAT_DTYPES))
        elif value is not None:
            dtype = draw(st.sampled_from(INT_DTYPES if draw(st.booleans()) else FLOAT_DTYPES))
        elif like is not None and draw(st.booleans()):
            dtype = like.dtype
        else:
            dtype = draw(st.sampled_from(self.dtypes))
        if h.get("shape_like") in self.binding and isinstance(self.binding[h["shape_like"]], torch.Tensor):
            shape = tuple(self.binding[h["shape_like"]].shape)
        elif value is not None and draw(st.booleans()):
            shape = ()  # a constant operand is usually a 0-dim tensor: it broadcasts without changing the shape
        elif "rank" in h:
            shape = tuple(draw(shapes(min_rank=h["rank"], max_rank=h["rank"])))
        elif like is not None and draw(st.integers(0, 2)):
            shape = self._broadcastable_to(tuple(like.shape))
        else:
            shape = tuple(draw(shapes(max_rank=MAX_RANK)))
        for dim, other, other_dim in h.get("dims_from", ()):  # dsl.dims_agree: a size taken from a bound tensor
            source = self.binding.get(other)
            if isinstance(source, torch.Tensor) and -len(shape) <= dim < len(shape) \
                    and -source.dim() <= other_dim < source.dim():
                i = dim % len(shape)
                shape = shape[:i] + (source.shape[other_dim],) + shape[i + 1:]
        for dim, size in h.get("dim_sizes", {}).items():  # dsl.dim_is: a dim of a known size
            if -len(shape) <= dim < len(shape):
                i = dim % len(shape)
                shape = shape[:i] + (size,) + shape[i + 1:]
        if value is not None and draw(st.integers(0, 2)):
            t = torch.full(shape, value, dtype=torch.float64).to(dtype)
        else:
            t = draw(tensors(shape, dtype, specials=self.specials))
        return self._layout(t)

    def _typed_value(self, v):
        """``v`` as a Python int or float (the typing decides promotion; both must be tried)."""
        if _float_only(v):
            return v
        return self.draw(st.sampled_from([int(v), float(v)]))

    def _broadcastable_to(self, shape: tuple) -> tuple:
        """``shape`` itself, or a shape that broadcasts against it (fewer dims, some set to 1)."""
        kind = self.draw(st.integers(0, 3))
        if kind <= 1 or not shape:
            return shape
        if kind == 2:
            return shape[self.draw(st.integers(0, len(shape))):]
        return tuple(1 if self.draw(st.booleans()) else s for s in shape)

    def _layout(self, t: torch.Tensor) -> torch.Tensor:
        """The same values in another memory layout: a transposed copy or an expanded row."""
        kind = self.draw(st.integers(0, 5))
        if kind == 0 and t.dim() >= 2:
            return t.transpose(0, 1).contiguous().transpose(0, 1)
        if kind == 1 and t.dim() >= 1 and t.shape[0] > 1:
            row = t[:1]
            return row.expand(t.shape)
        return t

    # -- non-tensor arguments ---------------------------------------------------------------------
    def argument(self, name: str, typ: str, arg_name: str, target, first: Any):
        """A value for an unbound variable at schema position ``arg_name: typ`` of ``target``.

        Returns ``_TENSOR`` for tensor positions (the caller draws a tensor there).
        """
        draw = self.draw
        rank = first.dim() if isinstance(first, torch.Tensor) else 0
        shape = tuple(first.shape) if isinstance(first, torch.Tensor) else ()
        base, optional, is_list = _schema_kind(typ)
        if base == "Tensor" or base == "Any":
            return _TENSOR
        if optional and draw(st.integers(0, 3)) == 0:
            return None
        if arg_name == "dtype":
            return draw(st.sampled_from(list(self.dtypes)))
        if arg_name in _ENUM_ARGUMENTS:
            return draw(st.sampled_from(_ENUM_ARGUMENTS[arg_name]))
        if is_list and base == "int":
            sizes_of = self.binding.get(self.hints.get(name, {}).get("sizes_of"))
            if isinstance(sizes_of, torch.Tensor) and draw(st.booleans()):
                return list(sizes_of.shape)  # what a shape_is(t, name) condition asks for
            if arg_name == "dims":
                return draw(permutations_of(rank))
            if arg_name == "dim":
                return draw(st.lists(st.integers(-rank, rank - 1), max_size=rank, unique=True)) if rank else []
            if "expand" in str(target) and draw(st.integers(0, 2)):
                return list(self._expansion(shape))
            if self.shapes_seen and draw(st.integers(0, 2)) == 0:
                candidates = [s for s in self.shapes_seen if math.prod(s) == math.prod(shape)]
                if candidates:
                    return list(draw(st.sampled_from(candidates)))
            return draw(reshapes(shape))
        if base == "int":
            if arg_name.startswith("dim"):
                return draw_dim(draw, rank, extra=1 if "unsqueeze" in str(target) else 0)
            if arg_name == "end" and shape:
                return draw(st.sampled_from([2**63 - 1, max(shape), 1, -1, 0]))
            if arg_name == "step":
                return draw(st.sampled_from([1, 1, 2]))
            return draw(st.integers(-2, 4))
        if base == "number":
            if "value" in self.hints.get(name, {}) and draw(st.booleans()):
                return self._typed_value(self.hints[name]["value"])
            return draw(st.sampled_from([s for s in SCALAR_CANDIDATES if not isinstance(s, bool)]))
        if base == "bool":
            return draw(st.booleans())
        if base == "float":
            return draw(st.sampled_from([0.0, -0.0, 1.0, 0.5, -1.0]))
        raise _Invalid(f"cannot draw a value of schema type {typ!r} for {target}:{arg_name}")

    def _expansion(self, shape: tuple) -> tuple:
        draw = self.draw
        if self.shapes_seen and draw(st.booleans()):
            return draw(st.sampled_from(self.shapes_seen))
        new = tuple(draw(st.integers(1, 3)) if s == 1 else (-1 if draw(st.integers(0, 3)) == 0 else s) for s in shape)
        lead = tuple(draw(st.lists(st.integers(1, 3), max_size=max(0, MAX_RANK - len(shape)))))
        return lead + new

    def scalar_or_tensor(self, name: str, like) -> Any:
        """An operand in a Tensor position after the first: a Python scalar (as in ATen graphs) or a tensor."""
        h = self.hints.get(name, {})
        if "value" in h and self.draw(st.integers(0, 2)) == 0:
            return self._typed_value(h["value"])
        if self.draw(st.integers(0, 3)) == 0 and not h.get("dtypes") and "shape_like" not in h:
            return self.draw(st.sampled_from(SCALAR_CANDIDATES))
        return self.tensor(name, like)

    # -- walking the pattern ---------------------------------------------------------------------
    def build(self, pattern):
        if not isinstance(pattern, OpPattern):
            raise TypeError(f"check_rule: left side must be an op pattern, got {pattern!r}")
        pos_types, kw_types = schema_types(pattern.target)
        names = _schema_names(pattern.target)
        if names[:2] == ["self", "dims"] and isinstance(pattern.args[0], Var) and isinstance(pattern.args[1], list) \
                and all(isinstance(i, int) for i in pattern.args[1]):
            # A literal permutation fixes the rank of the tensor it permutes.
            self.hints.setdefault(pattern.args[0].name, {}).setdefault("rank", len(pattern.args[1]))
        values: list = []
        first = None

        def value_for(p, typ: str | None, arg_name: str, index: int, in_list: bool = False):
            nonlocal first
            if isinstance(p, OpPattern):
                v = self.build(p)
            elif isinstance(p, Var):
                if p.name in self.binding:
                    v = self.binding[p.name]
                else:
                    t = typ or "Any"
                    v = self.argument(p.name, t, arg_name, pattern.target, first)
                    if v is _TENSOR:
                        if first is not None and index > 0 and not in_list:
                            v = self.scalar_or_tensor(p.name, first)
                        else:
                            v = self.tensor(p.name, first)
                    self.binding[p.name] = v
            elif isinstance(p, list):
                elem = _schema_kind(typ)[0] if typ else None
                v = [value_for(a, elem, arg_name, index + j, in_list=True) for j, a in enumerate(p)]
            else:
                v = p
            if first is None and isinstance(v, torch.Tensor):
                first = v
            if isinstance(v, torch.Tensor):
                self.shapes_seen.append(tuple(v.shape))
            return v

        for i, a in enumerate(pattern.args):
            typ = pos_types[i] if i < len(pos_types) else None
            values.append(value_for(a, typ, names[i] if i < len(names) else f"arg{i}", i))
        kwargs = {k: value_for(a, kw_types.get(k), k, 1) for k, a in pattern.kwargs.items()}
        try:
            out = pattern.target(*values, **kwargs)
        except Exception as e:  # noqa: BLE001 - an ill-formed random instance, not a rule bug
            raise _Invalid(f"{pattern.name} raised {type(e).__name__}: {e}") from None
        if isinstance(out, torch.Tensor):
            self.shapes_seen.append(tuple(out.shape))
        return out


def _schema_kind(typ: str) -> tuple[str, bool, bool]:
    """``"Optional[List[int]]"`` -> ``("int", True, True)``: base type, optional, list."""
    optional = is_list = False
    if typ.startswith("Optional[") and typ.endswith("]"):
        optional, typ = True, typ[len("Optional["):-1]
    if typ.endswith("?"):
        optional, typ = True, typ[:-1]
    if typ.startswith("List[") and typ.endswith("]"):
        is_list, typ = True, typ[len("List["):-1]
    elif typ.endswith("[]") or (typ.endswith("]") and "[" in typ):
        is_list, typ = True, typ[:typ.index("[")]
    if typ in ("SymInt", "int"):
        typ = "int"
    elif typ in ("Scalar", "number"):
        typ = "number"
    return typ, optional, is_list


def _schema_names(target) -> list[str]:
    if isinstance(target, torch._ops.OpOverload):
        return [a.name for a in target._schema.arguments if not a.kwarg_only]
    return []


@dataclasses.dataclass
class RuleCheckReport:
    """What `check_rule` found for one rule."""

    rule: str
    examples: int = 0  # random instances drawn
    valid: int = 0  # instances where the left side ran and the conditions held: compared
    guarded: int = 0  # instances the engine's dtype/shape guard would refuse (replacement differs)
    aliasing: int = 0  # instances where the replacement is a view of an input the left side was not
    error: str | None = None  # the counterexample, when the rule is unsound

    @property
    def ok(self) -> bool:
        return self.error is None

    def __str__(self):
        if not self.ok:  # hypothesis stops at the first counterexample (then shrinks it): no count to give
            return f"{self.rule}: UNSOUND (counterexample below)"
        return (f"{self.rule}: ok, {self.valid} of {self.examples} instances compared"
                f"{f', {self.guarded} refused by the dtype/shape guard' if self.guarded else ''}"
                f"{f', {self.aliasing} turn a fresh result into a view of an input' if self.aliasing else ''}")


def _short(value, layout: bool = False) -> str:
    """A value as a counterexample shows it: ``float32[2]: [nan, -0.0]`` (with ``layout``, odd strides too)."""
    if not isinstance(value, torch.Tensor):
        return repr(value)
    strides = f", strides {list(value.stride())}" if layout and not value.is_contiguous() else ""
    return f"{dtype_str(value.dtype)}{list(value.shape)}{strides}: {value.tolist()}"


def _describe_binding(binding: dict) -> str:
    return "\n".join(f"  {k} = {_short(v, layout=True)}" for k, v in binding.items())


def _shares_storage(value, binding: dict) -> bool:
    return input_aliases([value], binding.values())[0] is not None


def check_rule(rule, examples: int = 100, dtypes: Sequence[torch.dtype] = ALL_DTYPES,
               min_valid: int | None = None, *, print_counterexample: bool = True) -> RuleCheckReport:
    """Check ``rule`` on random instances of its left side; raise AssertionError if it is unsound.

    For each instance the left side is evaluated with torch, the conditions are evaluated on the
    concrete values (``rule.conditions_hold``), and the right side (a pattern, or a computed
    replacement) is evaluated on the same binding. Where the replacement's dtype or shape differs
    from the left side's, the engine's guard would refuse it: counted, not compared. Everything
    else must agree bit for bit: NaN where NaN, the sign of every zero, every integer; a rule
    declared ``exact=False`` (it may round differently: a fused kernel, a folded scale) within
    the dtype's tolerance instead, on the instances of its domain (`rewrite.dsl.in_domain`: no
    infinities or values large enough to overflow on one side only). A
    replacement that raises where the left side ran (e.g. a view of a non-viewable layout) is a
    counterexample too. The error message prints the rule, the variables and both results.

    Raises AssertionError as well when fewer than ``min_valid`` (default: a tenth of
    ``examples``, at least 3) instances could be compared, so a rule whose pattern the checker
    cannot instantiate never passes silently.
    """
    if not isinstance(rule, Rule):
        raise TypeError(f"check_rule takes a rewrite.dsl.Rule, got {type(rule).__name__}")
    if examples < 1:
        raise ValueError(f"check_rule: examples must be >= 1, got {examples}")
    orders = rule.each_order()
    if len(orders) > 1:  # a rule matching both operand orders (dsl.Rule.orders): each order is a claim
        parts = [check_rule(r, examples, dtypes, min_valid) for r in orders]
        return RuleCheckReport(rule.name, **{f: sum(getattr(p, f) for p in parts)
                                             for f in ("examples", "valid", "guarded", "aliasing")})
    report = RuleCheckReport(rule.name)
    min_valid = max(3, examples // 10) if min_valid is None else min_valid

    def compare_outputs(expected, actual, exact):  # a rule declared exact=False: within tolerance
        return compare_results(expected, actual, exact=exact and rule.exact)
    failures: list[str] = []

    # Hypothesis seeds its derandomized draws from run's source, decorators included: an edit to
    # these lines changes which instances every rule is checked on.
    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink],
              report_multiple_bugs=False)
    @given(st.data())
    def run(data):
        report.examples += 1
        inst = _Instantiator(data.draw, rule, dtypes)
        try:
            lhs = inst.build(rule.lhs)
            if not rule.conditions_hold(dict(inst.binding)):
                raise _Invalid("conditions do not hold")
        except _Invalid:
            return
        binding = dict(inst.binding)
        rhs: Any = "<raised>"
        try:
            rhs = rule.apply(binding)
        except Exception as e:  # noqa: BLE001 - the left side ran, so the replacement must too
            why = f"the replacement raised {type(e).__name__}: {e}"
        else:
            if isinstance(lhs, torch.Tensor) and isinstance(rhs, torch.Tensor) and (
                    lhs.dtype != rhs.dtype or lhs.shape != rhs.shape):
                report.guarded += 1
                return
            if isinstance(lhs, torch.Tensor) and not _shares_storage(lhs, binding) and _shares_storage(rhs, binding):
                report.aliasing += 1
            why = compare_outputs((lhs,), (rhs,), exact=True)
            if why and why.startswith("output 0: "):
                why = why[len("output 0: "):]
        report.valid += 1
        if why:
            message = (f"rule {rule!r} is unsound: {why}\ncounterexample:\n{_describe_binding(binding)}\n"
                       f"  left side  = {_short(lhs)}\n  right side = {_short(rhs)}")
            failures.append(message)
            raise AssertionError(message)

    try:
        run()
    except AssertionError:
        report.error = failures[-1] if failures else "check failed"
        # Print the (shrunk) counterexample so a test log shows it even when the error is caught
        # (check_ruleset does not: its report prints each counterexample once).
        if print_counterexample:
            print(report.error)
        raise AssertionError(report.error) from None
    if report.valid < min_valid:
        report.error = (f"rule {rule.name}: only {report.valid} of {report.examples} random instances could be "
                        f"compared (need {min_valid}); the checker cannot instantiate its pattern "
                        f"{rule.lhs!r} with conditions {list(rule.when)}")
        raise AssertionError(report.error)
    return report


def check_ruleset(ruleset, examples: int = 100) -> list[RuleCheckReport]:
    """`check_rule` on every rule of ``ruleset``; unsound rules are reported, not raised."""
    reports = []
    for r in ruleset.rules:
        try:
            reports.append(check_rule(r, examples=examples, print_counterexample=False))
        except AssertionError as e:
            reports.append(RuleCheckReport(r.name, error=str(e)))
    return reports


@dataclasses.dataclass
class ModuleCheckReport:
    """`check_ruleset_module`'s result: one `RuleCheckReport` per rule, grouped by ruleset."""

    module: str
    rulesets: dict = dataclasses.field(default_factory=dict)  # ruleset name -> [RuleCheckReport]

    @property
    def reports(self) -> list[RuleCheckReport]:
        return [r for rs in self.rulesets.values() for r in rs]

    @property
    def failures(self) -> list[RuleCheckReport]:
        return [r for r in self.reports if not r.ok]

    @property
    def ok(self) -> bool:
        return not self.failures

    def __str__(self):
        n = len(self.reports)
        lines = [f"{self.module}: {len(self.rulesets)} ruleset(s), {n} rule(s), "
                 f"{n - len(self.failures)} sound, {len(self.failures)} unsound"]
        for name, reports in self.rulesets.items():
            lines.append(f"  ruleset {name}:")
            lines.extend(f"    {r}" for r in reports)
        for r in self.failures:
            lines.append("")
            lines.append(r.error)
        return "\n".join(lines)


def check_ruleset_module(module_name: str, examples: int = 100) -> ModuleCheckReport:
    """Import ``module_name``, find its `RuleSet` objects (module attributes, or lists of them) and check every rule.

    Used by ``python -m rewrite check-rules MODULE``; ``report.ok`` says whether all rules are sound.
    """
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"check-rules: cannot import module {module_name!r}: {e}. Give an importable "
                         "module path such as 'mypkg.my_rules' (the module must be on sys.path)") from e
    found: dict[str, RuleSet] = {}
    for value in vars(module).values():
        candidates = value if isinstance(value, (list, tuple)) else [value]
        for v in candidates:
            if isinstance(v, RuleSet):
                found.setdefault(v.name, v)
    if not found:
        raise ValueError(f"check-rules: module {module_name!r} defines no rewrite.dsl.RuleSet objects; "
                         "define one at module level, e.g. RULES = RuleSet('mine', [rule(...), ...])")
    report = ModuleCheckReport(module_name)
    for name, rs in found.items():
        log.info("checking ruleset %s (%d rules)", name, len(rs.rules))
        report.rulesets[name] = check_ruleset(rs, examples=examples)
    return report
