"""Is an FX pass sound? Run random graphs before and after it on hostile inputs and compare.

`check_rule` answers this for one rewrite rule; most graph passes are written on torch.fx instead
(custom Inductor passes, ``post_grad_custom_pre_pass``, compilers of one's own), and nothing else
asks them "does the pass keep the meaning of every graph?". `check_fx_pass` does, with the graphs
and inputs that break passes:

* graphs: random core-ATen graphs with ``meta["val"]`` / ``meta["tensor_meta"]`` on every node
  (`fx_cases`); with ``dynamic=True`` graphs with symbolic sizes, run at several sizes their
  guards allow (`rewrite.testing.dynamic`), so a pass that bakes in a size it saw is caught;
* inputs: seasoned with NaN, +-inf, -0.0 and the extreme integers;
* comparison: bit for bit by default (NaN matches NaN, -0.0 differs from 0.0; ``tolerance`` for
  passes that reassociate), inputs the graph mutates (which ones, and their values after the call),
  and aliasing: an output must not start or stop sharing memory with an input, a constant of the
  module, or another output (a caller writing to one would see the other change);
* report: hypothesis shrinks a failure to a small graph and the AssertionError shows it as FX code
  before and after the pass, the inputs and the differing elements; a pass that raises is reported
  the same way, with its traceback.

Checking a pass::

    from rewrite.testing import check_fx_pass

    def fold_mul_zero(gm):                      # unsound: x * 0 is NaN for x = inf, -0.0 for x < 0
        for node in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.mul.Tensor):
            if node.args[1] == 0:
                with gm.graph.inserting_before(node):
                    zeros = gm.graph.call_function(torch.ops.aten.zeros_like.default, (node.args[0],))
                node.replace_all_uses_with(zeros)
                gm.graph.erase_node(node)

    check_fx_pass(fold_mul_zero)                # AssertionError: ... expected nan, got 0.0 ...
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import time
import traceback
from typing import Any, Callable, Sequence

import torch
import torch.fx
from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Unsatisfiable
from hypothesis import strategies as st

from ..ops import dtype_str
from ..user_passes import apply_fx_pass, takes_graph
from .dynamic import SizeConstraints
from .equivalence import compare_tensors, describe_inputs, storage_address, tolerance, tolerance_option
from .strategies import shrinking_limited_to
from .fx_graphs import (
    GRAPH_DTYPES, SIZES_PER_GRAPH, FxCase, case_inputs, case_sizes, decomposition_table, fx_cases, select_ops,
)

__all__ = ["check_fx_pass", "fx_pass_test", "PassCheckReport", "load_pass"]

LISTED = 4  # differing elements named in a report
SWEEP_EXAMPLES = 2  # graphs of each changed op alone, per dtype, before the random graphs
# Tiny graphs per op when probing which ops a pass changes. Three were too few: hypothesis draws the
# simplest scalar (0.0) first, which a pass guarding ``c != 0`` skips, so a pass rewriting ``x / c``
# looked like it changed nothing (issue 30). The probe stops at an op's first changed graph.
PROBE_EXAMPLES = 12
# A pass that changed fewer random graphs than this gets more graphs drawn around the ops it changes
# (up to EXTRA_ROUNDS times ``examples``); still fewer is a failure saying so: "ok" on two changed
# graphs is no evidence.
MIN_CHANGED = 20
EXTRA_ROUNDS = 4


@dataclasses.dataclass
class PassCheckReport:
    """What a passing `check_fx_pass` ran: how many graphs, how many the pass changed, how fast."""

    name: str
    dynamic: bool
    graphs: int = 0  # graphs the pass ran on (the examples hypothesis drew)
    changed: int = 0  # graphs whose code the pass changed
    runs: int = 0  # before/after runs compared (dynamic graphs run at several sizes)
    invalid: int = 0  # drawn graphs left out because the graph itself failed to run (should stay 0)
    focus: tuple[str, ...] = ()  # op generators whose one-op graphs the pass changed (see _probe)
    swept: int = 0  # one-op graphs of the focus ops checked in every dtype (not counted above)
    extra: int = 0  # graphs drawn around the focus ops because the pass had changed too few (counted in graphs)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return True  # a failing check raises instead of returning a report

    @property
    def graphs_per_second(self) -> float:
        return self.graphs / self.seconds if self.seconds else 0.0

    def __str__(self):
        kind = "dynamic-shape" if self.dynamic else "static"
        text = (f"{self.name}: ok on {self.graphs} random {kind} graphs ({self.changed} changed by the pass), "
                f"{self.runs} runs compared bit for bit or within tolerance, {self.seconds:.1f} s")
        if self.focus:
            text += (f"\n  the pass changed one-op graphs of: {', '.join(self.focus)} "
                     f"({self.swept} graphs of them alone in every dtype, then half the graphs drawn around them)")
        if self.extra:
            text += f"\n  {self.extra} more graphs drawn around those ops because too few had been changed"
        if not self.changed:
            text += ("\n  note: the pass changed none of the graphs, so this says little; "
                     "draw graphs it rewrites (ops=..., dtypes=...)")
        return text


# ================================================================================================
# Running a graph module and what one run shows
# ================================================================================================

@dataclasses.dataclass
class _Run:
    outputs: tuple
    inputs: list  # the inputs after the call (the graph may update them)
    mutated: list[bool]  # per input: did an in-place op write to it (its version counter moved)
    aliases: list  # per output: ("input", i), ("constant", name) or None for fresh memory
    shared: list[tuple[int, ...]]  # per output: the other outputs sharing its memory


def _module_constants(gm: torch.fx.GraphModule) -> list[tuple[str, torch.Tensor]]:
    out = []
    for node in gm.graph.find_nodes(op="get_attr"):
        obj = gm
        for part in node.target.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, torch.Tensor):
            out.append((node.target, obj))
    return out


def _execute(gm: torch.fx.GraphModule, inputs: Sequence[torch.Tensor]) -> _Run:
    args = [t.clone() for t in inputs]
    versions = [t._version for t in args]
    with torch.no_grad():
        result = gm(*args)
    outputs = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    owners: dict[int, Any] = {}
    for name, value in _module_constants(gm):
        owners.setdefault(storage_address(value), ("constant", name))
    for i, t in enumerate(args):
        owners[storage_address(t)] = ("input", i)
    owners.pop(None, None)
    storages = [storage_address(o) for o in outputs]
    shared = [tuple(j for j, s in enumerate(storages) if j != i and s is not None and s == mine)
              for i, mine in enumerate(storages)]
    return _Run(outputs, args, [t._version != v for t, v in zip(args, versions)],
                [owners.get(s) for s in storages], shared)


def _owner_text(owner, names: Sequence[str]) -> str:
    if owner is None:
        return "fresh memory"
    kind, which = owner
    return f"input {names[which]}" if kind == "input" else f"the module's constant self.{which}"


def _alias_kept(before, after) -> bool:
    """Whether an output's owner after the pass is acceptable given its owner before.

    The same input, or both some constant (a pass may rename constants); an output that was a view
    of a constant may become fresh memory (folding it only protects the constant from the caller).
    """
    if before is None or after is None:
        return before is after or (after is None and before[0] == "constant")
    return before[0] == after[0] and (before[0] == "constant" or before[1] == after[1])


def _difference(before: _Run, after: _Run, names: Sequence[str], exact: bool, tol, check_aliasing: bool) -> str | None:
    """What differs between the runs before and after the pass (None: nothing)."""
    if len(before.outputs) != len(after.outputs):
        return f"the graph returns {len(after.outputs)} values after the pass, {len(before.outputs)} before"
    for i, (e, a) in enumerate(zip(before.outputs, after.outputs)):
        if isinstance(e, torch.Tensor):
            why = compare_tensors(e, a, exact, tol, listed=LISTED)
        else:
            why = None if e == a else f"expected {e!r}, got {a!r}"
        if why:
            return f"output {i}: {why}"
    for i, name in enumerate(names):
        if before.mutated[i] != after.mutated[i]:
            now, was = ("is", "was not") if after.mutated[i] else ("is not", "was")
            return f"input {name} {now} mutated by the graph after the pass but {was} before"
        why = compare_tensors(before.inputs[i], after.inputs[i], exact, tol, listed=LISTED)
        if why:
            return f"input {name} after the call (the graph writes to it): {why}"
    if not check_aliasing:
        return None
    for i, (b, a) in enumerate(zip(before.aliases, after.aliases)):
        if not _alias_kept(b, a):
            return (f"output {i} is {_owner_text(a, names)} after the pass but was {_owner_text(b, names)} "
                    "before: a caller writing to one would change the other")
    for i, (b, a) in enumerate(zip(before.shared, after.shared)):
        if b != a:
            return (f"output {i} shares memory with outputs {list(a)} after the pass, with {list(b)} before: "
                    "a caller writing to one output would change the other")
    return None


# ================================================================================================
# Applying the pass
# ================================================================================================

def _snapshot(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` the pass cannot reach: its own graph (node meta copied shallowly) and constants."""
    ref = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    for name, value in _module_constants(ref):
        owner, _, attr = name.rpartition(".")
        setattr(ref.get_submodule(owner) if owner else ref, attr, value.clone())
    return ref


def _traceback_of_pass(error: BaseException) -> str:
    """The traceback from the pass's own frames down (our frames above it say nothing)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb)).rstrip()


# ================================================================================================
# Reports
# ================================================================================================

def _placeholder_line(node: torch.fx.Node) -> str:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return f"#   {node.name}: {dtype_str(val.dtype)}[{', '.join(str(s) for s in val.shape)}]"
    return f"#   {node.name}: {val!r}"


def _fx_code(gm: torch.fx.GraphModule) -> str:
    inputs = [_placeholder_line(n) for n in gm.graph.find_nodes(op="placeholder")]
    return "\n".join(["# inputs:", *inputs, gm.code.strip()])


def _failure(name: str, why: str, case: FxCase, before: torch.fx.GraphModule, after: torch.fx.GraphModule | None,
             sizes: dict | None = None, inputs=None, detail: str | None = None) -> AssertionError:
    parts = [f"check_fx_pass: {name} is unsound: {why}"]
    names = [n.name for n in before.graph.find_nodes(op="placeholder")]
    if sizes:
        parts.append("sizes: " + ", ".join(f"{s} = {v}" for s, v in sizes.items())
                     + f" (the graph was traced at {', '.join(f'{s} = {v}' for s, v in case.trace_sizes.items())})")
    if inputs is not None:
        parts.append("inputs:\n" + describe_inputs(inputs, names))
    parts.append("graph before the pass (FX code):\n" + _fx_code(before))
    if after is not None:
        parts.append("graph after the pass (FX code):\n" + _fx_code(after))
    if detail:
        parts.append(detail)
    if case.dynamic:
        parts.append("the graph was traced from this program (make_fx, symbolic sizes):\n" + str(case.origin))
    return AssertionError("\n\n".join(parts))


# ================================================================================================
# The checker
# ================================================================================================





def _probe(pass_fn, takes: str, cases: Callable, ops: Sequence[str], dynamic: bool) -> tuple[str, ...]:
    """The op generators the pass reacts to: those whose small one-op graphs it changes or crashes on.

    Most passes rewrite a few ops, and among ~40 a given op is in few random graphs, so a pass that
    rewrites ``x * 0`` would meet a float ``x * 0`` in about one graph in a hundred. A few tiny
    graphs per op (cheap) tell which ops matter; half the graphs are then drawn around those.
    """
    fired = []
    for op in ops:
        hit: list[bool] = []

        @settings(max_examples=1 if dynamic else PROBE_EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck), phases=[Phase.generate])
        @given(cases(ops=[op], max_ops=3))
        def probe(case):
            if hit:
                return
            before = case.gm.code
            try:
                hit.append(apply_fx_pass(pass_fn, case.gm, takes).code != before)
            except Exception:  # noqa: BLE001 - the main check reports the crash with its graph
                hit.append(True)
            if not hit[-1]:
                hit.pop()

        probe()
        if hit:
            fired.append(op)
    return tuple(fired)


def check_fx_pass(pass_fn: Callable, *, examples: int = 200, dynamic: bool = False,
                  dtypes: Sequence[torch.dtype] | None = None, ops: Sequence[str] | None = None,
                  tolerance=None, specials: bool = True, check_aliasing: bool = True, takes: str | None = None,
                  sizes: int = SIZES_PER_GRAPH, max_ops: int = 8, focus: bool = True, decompositions="core",
                  seed: int | None = None, shrink_seconds: float = 60.0,
                  min_changed: int | None = None) -> PassCheckReport:
    """Check that ``pass_fn`` keeps the meaning of random graphs; raise AssertionError if it does not.

    ``pass_fn(gm)`` gets a ``torch.fx.GraphModule`` of ATen ops with ``meta["val"]`` (FakeTensors)
    and ``meta["tensor_meta"]`` on its nodes, and returns a GraphModule or changes ``gm`` in place
    and returns None (``takes="graph"``: it gets ``gm.graph``, as Inductor's graph passes do;
    Inductor ``CustomGraphPass`` objects are called that way automatically; a TorchAir-style
    ``pass_fn(gm, example_inputs, config)`` gets the placeholders' fake values and a default
    config: `rewrite.user_passes` calls passes as the backend's post_grad hooks do). Graphs are traced
    with ``decompositions``: ``"core"`` (the core ATen opset), ``"inductor"`` (what Inductor's
    post-grad passes see), None, or a decomposition table.

    ``examples`` graphs are drawn (over ``dtypes`` and the op generators named in ``ops``: names
    from `rewrite.testing.OPS` and `FILL_OPS`, or from `rewrite.testing.dynamic.DYNAMIC_OPS` with
    ``dynamic``); with ``dynamic`` each graph has symbolic sizes and runs at ``sizes`` size
    assignments its guards allow. With ``focus`` (the default) the pass first runs on tiny graphs
    of each op; each op it changed (`PassCheckReport.focus`) is then checked alone in every dtype,
    and half the random graphs are drawn around those ops. Outputs and mutated inputs are compared bit for bit, or with
    ``tolerance="dtype"`` / ``(rtol, atol)`` within a tolerance (for passes that reassociate;
    ``specials=False`` leaves out NaN/inf/extremes, which reassociation legitimately changes);
    ``check_aliasing=False`` skips the memory-sharing checks. Draws are the same every run unless
    ``seed`` is given. Shrinking a failure stops after about ``shrink_seconds``.

    A pass whose one-op graphs the probe found changed, but that changed fewer random graphs than
    ``min_changed`` (default `MIN_CHANGED` = 20, or ``examples`` when fewer are asked for), gets up
    to ``EXTRA_ROUNDS * examples`` more graphs of those ops until it has; if it still has not, the
    check fails saying so (an "ok" on three changed graphs is no evidence). ``min_changed=0``
    accepts any number; ``focus=False`` skips the probe and this. A pass that changed no graph
    passes with a note saying the check says little (identity and clean-up passes are legitimate).
    Returns a `PassCheckReport` when every graph agreed.
    """
    exact, tol = tolerance_option(tolerance)
    if takes is None:
        takes = "graph" if takes_graph(pass_fn) else "module"
    if takes not in ("module", "graph"):
        raise ValueError(f"takes={takes!r}: use 'module' (the pass gets the GraphModule) or 'graph' (gm.graph)")
    if examples < 1:
        raise ValueError(f"examples={examples} must be at least 1")
    if min_changed is None:
        min_changed = min(MIN_CHANGED, examples)
    if not isinstance(min_changed, int) or isinstance(min_changed, bool) or min_changed < 0:
        raise ValueError(f"min_changed={min_changed!r} must be an int >= 0 (0 accepts any number of changed graphs)")
    chosen = [o.name for o in select_ops(ops, dynamic)]  # a bad op name is an error before any work
    table = decomposition_table(decompositions)
    cases = functools.partial(fx_cases, dynamic=dynamic, dtypes=dtypes, max_ops=max_ops, decompositions=table)
    strategy = cases(ops=chosen)
    name = getattr(pass_fn, "__qualname__", None) or type(pass_fn).__name__
    report = PassCheckReport(name, dynamic)
    start = time.perf_counter()
    report.focus = _probe(pass_fn, takes, cases, chosen, dynamic) if focus else ()
    others = [o for o in chosen if o not in report.focus]

    def check_one(data):
        if report.focus and data.draw(st.booleans(), label="around the ops the pass changes"):
            names = list(report.focus) + (data.draw(st.lists(st.sampled_from(others), max_size=4, unique=True))
                                          if others else [])
            case: FxCase = data.draw(cases(ops=names), label="graph")
        else:
            case = data.draw(strategy, label="graph")
        check_case(data, case)

    def check_case(data, case: FxCase, swept: bool = False):
        before = _snapshot(case.gm)
        try:
            after = apply_fx_pass(pass_fn, case.gm, takes)
        except Exception as e:  # noqa: BLE001 - a pass that crashes is a finding, reported with its graph
            raise _failure(name, f"the pass raised {type(e).__name__}: {e}", case, before, None,
                           detail="traceback of the pass:\n" + _traceback_of_pass(e)) from None
        names = [n.name for n in before.graph.find_nodes(op="placeholder")]
        constraints = SizeConstraints(before)  # read after the pass: guards it added count
        for assignment in data.draw(case_sizes(case, constraints, sizes), label="sizes"):
            inputs = data.draw(case_inputs(case, assignment, specials), label="inputs")
            try:
                expected = _execute(before, inputs)
            except Exception:  # noqa: BLE001 - our graph is invalid here: not the pass's fault
                report.invalid += 1
                reject()
            try:
                got = _execute(after, inputs)
            except Exception as e:  # noqa: BLE001
                why = f"the graph after the pass raised {type(e).__name__}: {e}"
                detail = "traceback:\n" + "".join(traceback.format_exception(e)).rstrip()
            else:
                why, detail = _difference(expected, got, names, exact, tol, check_aliasing), None
            report.runs += not swept
            if why:
                raise _failure(name, why, case, before, after, assignment if case.dynamic else None, inputs, detail)
        if swept:
            report.swept += 1
            return
        report.graphs += 1  # counted once every run of the graph is compared
        report.changed += after.code != before.code

    def checking(strategy):
        def check_drawn(data):
            check_case(data, data.draw(strategy, label="graph"), swept=True)
        return check_drawn

    def run(check, max_examples: int, round_seed: int | None = None):
        fixed = seed if round_seed is None else (seed or 0) * 1000 + round_seed
        test = settings(max_examples=max_examples, deadline=None, database=None, derandomize=fixed is None,
                        suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink],
                        report_multiple_bugs=False, print_blob=False)(given(st.data())(check))
        if fixed is not None:
            test = hypothesis_seed(fixed)(test)
        with shrinking_limited_to(shrink_seconds):
            test()

    # Each op the pass changes, alone, in every dtype: a pass wrong for one dtype (bool ** 2 is
    # int64) is found whatever the random graphs below happen to draw.
    for op in report.focus:
        for dtype in dtypes or GRAPH_DTYPES:
            with contextlib.suppress(Unsatisfiable):  # the op has no graph in this dtype
                run(checking(cases(ops=[op], dtypes=(dtype,), max_ops=2)), SWEEP_EXAMPLES)
    run(check_one, examples)
    if report.changed < min_changed and report.focus:
        # Few changed graphs: draw graphs around the changed ops only, until enough are changed.
        def check_around_focus(data):  # graphs of the changed ops only: most of them reach the rewrite
            check_case(data, data.draw(cases(ops=list(report.focus)), label="graph of the ops the pass changes"))

        drawn = report.graphs
        for round_no in range(1, EXTRA_ROUNDS + 1):  # a round each (own seed), until enough are changed
            run(check_around_focus, examples, round_seed=round_no)
            if report.changed >= min_changed:
                break
        report.extra = report.graphs - drawn
    report.seconds = time.perf_counter() - start
    # Too few changed graphs fail when the probe found ops the pass changes (graphs of them were drawn
    # and still too few changed). Without such ops there is nothing to draw around (a pass that changed
    # nothing, or only larger graphs the probe's tiny ones miss): the report's counts say how much ran.
    if report.focus and report.changed < min_changed:
        where = f"{report.extra} more graphs drawn of the ops it changes ({', '.join(report.focus)})"
        raise AssertionError(
            f"check_fx_pass: {name}: inconclusive: the pass changed only {report.changed} of {report.graphs} "
            f"random graphs ({where}), fewer than min_changed={min_changed}, so its rewrite was barely "
            f"exercised. Draw graphs it rewrites (ops=[...], dtypes=[...]), or accept this with min_changed=0.")
    return report


def fx_pass_test(pass_fn: Callable | None = None, **options):
    """A pytest test checking ``pass_fn`` with `check_fx_pass` (``options`` as there).

    As a decorator, the decorated pass becomes the test (its name should start with ``test_``)::

        @fx_pass_test(examples=100, dynamic=True)
        def test_my_pass(gm):
            my_pass(gm)

    or ``test_my_pass = fx_pass_test(my_pass, examples=100)``. The pass stays at ``test.pass_fn``.
    """
    def make(fn: Callable):
        def test():
            check_fx_pass(fn, **options)

        # No functools.wraps: pytest would read the pass's ``gm`` parameter as a fixture request.
        test.__name__ = getattr(fn, "__name__", "test_fx_pass")
        test.__qualname__ = getattr(fn, "__qualname__", test.__name__)
        test.__module__ = getattr(fn, "__module__", __name__)
        test.__doc__ = getattr(fn, "__doc__", None)
        test.pass_fn = fn
        return test

    return make(pass_fn) if pass_fn is not None else make


def load_pass(spec: str) -> Callable:
    """The pass named by ``module:function`` (the function part may be dotted: ``mod:Class.method``).

    Raises ValueError naming what is wrong: no colon, a module that does not import, no such name.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r}: name the pass as module:function (e.g. my_passes:fold_mul_zero)")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import module {module_name!r}: {e}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{spec} is a {type(obj).__name__}, not a callable pass")
    return obj
