"""check_fx_pass: planted unsound FX passes are caught with a small counterexample; sound ones pass.

Each planted pass is wrong in exactly one way (-0.0, NaN, one dtype, sizes other than the traced
ones, aliasing, mutation, a crash); the test asserts the report names that way, shows the graph
as FX code with the differing elements, and that the shrunk graph is small.
"""
from __future__ import annotations

import copy
import operator
import math
import re
import sys
import textwrap

import pytest
import torch
import torch.fx
from hypothesis import HealthCheck, given, settings
from torch.fx.experimental.symbolic_shapes import guard_int

from rewrite.cli import main as cli_main
from rewrite.testing import FxCase, check_fx_pass, fx_cases, fx_pass_test, load_pass
from rewrite.testing.dynamic import SizeConstraints

aten = torch.ops.aten
FLOAT = (torch.float32,)


def rewrite_calls(target, make, name):
    """A pass replacing each call of ``target`` by ``make(graph, node)`` (None keeps the node)."""
    def pass_fn(gm: torch.fx.GraphModule):
        for node in list(gm.graph.find_nodes(op="call_function", target=target)):
            with gm.graph.inserting_before(node):
                new = make(gm.graph, node)
            if new is not None:
                node.replace_all_uses_with(new)
                gm.graph.erase_node(node)

    pass_fn.__name__ = pass_fn.__qualname__ = name
    return pass_fn


def failure(pass_fn, **options) -> str:
    """The counterexample check_fx_pass reports (shrinking bounded: CI time, and most of the
    reduction comes in the first seconds)."""
    options.setdefault("shrink_seconds", 8)
    with pytest.raises(AssertionError) as err:
        check_fx_pass(pass_fn, **options)
    return str(err.value)


def graph_after(message: str) -> str:
    return message.split("graph after the pass (FX code):")[1].split("\n\n")[0]


def ops_in(code: str) -> int:
    return len(re.findall(r"torch\.ops\.aten\.\w+\.\w+\(", code))


def assert_small(message: str, max_ops: int = 3):
    before = message.split("graph before the pass (FX code):")[1].split("\n\n")[0]
    assert "def forward(" in before
    assert ops_in(before) <= max_ops, f"the counterexample was not shrunk:\n{message}"


# -- planted unsound passes ----------------------------------------------------------------------

def test_catches_a_pass_wrong_only_for_negative_zero():
    # x + 0 -> x is exact for every value but -0.0 (-0.0 + 0 is +0.0).
    add_zero = rewrite_calls(aten.add.Tensor, lambda g, n: g.call_function(aten.clone.default, (n.args[0],))
                             if n.args[1] == 0 else None, "add_zero_is_identity")
    message = failure(add_zero, examples=80, ops=["add_scalar", "neg"], dtypes=FLOAT)
    assert "add_zero_is_identity is unsound: output 0:" in message
    assert "expected 0.0, got -0.0" in message
    assert "aten.add.Tensor" in message and "aten.clone.default" in graph_after(message)
    assert_small(message)


def test_catches_a_pass_wrong_only_for_nan():
    # x == x -> True is right for every value but NaN.
    eq_self = rewrite_calls(
        aten.eq.Tensor,
        lambda g, n: g.call_function(aten.ones_like.default, (n.args[0],), {"dtype": torch.bool})
        if n.args[0] is n.args[1] else None, "eq_self_is_true")
    message = failure(eq_self, examples=80, ops=["eq", "exp", "neg"], dtypes=FLOAT)
    assert "expected False, got True" in message
    assert "nan" in message.split("inputs:")[1].split("graph before")[0]
    assert_small(message, max_ops=4)


def test_catches_a_pass_wrong_only_for_one_dtype():
    # x * x -> x ** 2 is exact for every dtype but bool (bool ** 2 is int64).
    square = rewrite_calls(aten.mul.Tensor, lambda g, n: g.call_function(aten.pow.Tensor_Scalar, (n.args[0], 2))
                           if n.args[0] is n.args[1] else None, "square_as_pow")
    options = dict(examples=60, ops=["mul", "neg"])
    check_fx_pass(square, dtypes=(torch.float32, torch.int64, torch.int8), **options)  # sound there
    message = failure(square, **options)
    assert "dtype torch.int64 differs from expected torch.bool" in message
    assert re.search(r"arg\d_1: bool\[", message)  # the shrunk graph's input is bool
    assert_small(message)


def _specialize_sizes(gm: torch.fx.GraphModule, guard: bool) -> None:
    """Replace every sym_size node by the size seen at trace time (with a guard: as Inductor may)."""
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.sym_size.int)):
        size = node.meta["val"]
        node.replace_all_uses_with(guard_int(size) if guard else size.node.hint)
        gm.graph.erase_node(node)


def test_catches_a_pass_that_bakes_in_the_traced_size():
    def bake_sizes(gm):  # reads the hint without a guard: right only at the traced size
        _specialize_sizes(gm, guard=False)

    message = failure(bake_sizes, examples=40, dynamic=True, ops=["flatten", "slice", "size_arith", "neg"],
                      dtypes=FLOAT)
    assert "sizes: " in message and "(the graph was traced at" in message
    sizes, traced = re.search(r"sizes: (.*) \(the graph was traced at (.*)\)", message).groups()
    assert sizes != traced
    assert "aten.sym_size.int" in message.split("graph after the pass")[0]
    assert "the graph was traced from this program" in message and "def program(" in message
    assert_small(message, max_ops=4)


def test_a_pass_that_specializes_with_a_guard_is_sound():
    # Inductor would recompile for other sizes: the checker only runs sizes the new guard allows.
    def guarded(gm):
        _specialize_sizes(gm, guard=True)

    report = check_fx_pass(guarded, examples=25, dynamic=True, ops=["flatten", "slice", "size_arith"], dtypes=FLOAT)
    assert report.changed > 0 and report.runs >= report.graphs


def test_catches_a_pass_that_makes_an_output_alias_an_input():
    # clone(x) -> x: equal values, but the caller's output now is its input.
    drop_clone = rewrite_calls(aten.clone.default, lambda g, n: n.args[0], "drop_clone")
    message = failure(drop_clone, examples=60, ops=["clone"])
    assert re.search(r"output \d is input \w+ after the pass but was fresh memory before", message)
    assert_small(message, max_ops=1)


def test_catches_a_pass_that_makes_an_output_stop_aliasing_an_input():
    alias_to_clone = rewrite_calls(aten.alias.default, lambda g, n: g.call_function(aten.clone.default, n.args),
                                   "alias_to_clone")
    message = failure(alias_to_clone, examples=60, ops=["alias"])
    assert re.search(r"output \d is fresh memory after the pass but was input \w+ before", message)
    assert_small(message, max_ops=1)


def test_catches_a_cse_that_merges_two_outputs():
    # Merging x.neg() computed twice is right inside a graph, but when both are returned the caller
    # gets one tensor twice: writing to one output changes the other.
    message = failure(naive_cse, examples=100, ops=["neg"])
    assert re.search(r"output \d shares memory with outputs \[\d\] after the pass, with \[\] before", message)
    assert_small(message, max_ops=2)


def test_catches_a_pass_that_drops_an_input_mutation():
    drop_copy = rewrite_calls(aten.copy_.default, lambda g, n: n.args[1], "drop_input_update")
    message = failure(drop_copy, examples=100, ops=["neg", "abs"], dtypes=FLOAT)
    assert re.search(r"input \w+ is not mutated by the graph after the pass but was before", message)
    assert "aten.copy_.default" in message.split("graph after the pass (FX code)")[0]


def test_a_crash_in_the_pass_is_reported_with_its_graph_and_traceback():
    def picky(gm):
        for node in gm.graph.find_nodes(op="call_function", target=aten.permute.default):
            raise NotImplementedError(f"cannot handle {node.name}")

    message = failure(picky, examples=60, ops=["permute", "neg"])
    assert "the pass raised NotImplementedError: cannot handle permute" in message
    assert "traceback of the pass:" in message and "in picky" in message
    assert "aten.permute.default" in message
    assert_small(message, max_ops=1)


def test_tolerance_accepts_a_pass_that_rounds_differently():
    def div_to_mul(g, n):  # x / c -> x * (1 / c): off in the last bit for c = 3
        c = n.args[1]
        return g.call_function(aten.mul.Tensor, (n.args[0], 1.0 / c)) if isinstance(c, (int, float)) and c else None

    pass_fn = rewrite_calls(aten.div.Tensor, div_to_mul, "div_as_mul")
    options = dict(examples=80, ops=["div_scalar"], dtypes=FLOAT, focus=False)
    assert "elements differ" in failure(pass_fn, **options)
    assert check_fx_pass(pass_fn, tolerance="dtype", **options).changed > 0
    with pytest.raises(ValueError, match="tolerance="):
        check_fx_pass(pass_fn, tolerance="loose")


# -- sound passes pass ---------------------------------------------------------------------------

def identity(gm):
    return None


def rebuild(gm):  # returns a new GraphModule instead of editing in place
    return torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))


def dead_code(gm):
    gm.graph.eliminate_dead_code()  # FX keeps impure nodes (copy_ into inputs)


def _literal_key(value):
    """Literals keyed by type and spelling: 0.0 == -0.0 and 1 == 1.0 == True in Python, not in a graph."""
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_literal_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _literal_key(v)) for k, v in value.items())))
    if isinstance(value, torch.fx.Node):
        return ("node", value)
    return (type(value).__name__, repr(value))


def _cse(gm, keep_outputs_apart: bool):
    seen = {}
    output = gm.graph.output_node()
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.is_impure():
            continue
        key = (node.target, _literal_key(node.args), _literal_key(node.kwargs))
        first = seen.setdefault(key, node)
        # "Is it returned" is asked now, not once up front: an earlier merge may have made `first`
        # an output (check_fx_pass found exactly that bug in a first version of this pass).
        if first is not node and not (keep_outputs_apart and output in first.users and output in node.users):
            node.replace_all_uses_with(first)
            gm.graph.erase_node(node)


def cse(gm):
    """Merge pure calls with the same target and arguments, but never two values that are both returned."""
    _cse(gm, keep_outputs_apart=True)


def naive_cse(gm):
    _cse(gm, keep_outputs_apart=False)


def _storage(node: torch.fx.Node):
    return torch.multiprocessing.reductions.StorageWeakRef(node.meta["val"].untyped_storage())


def mul_one_ints(gm):
    """x * 1 -> x for integer x. Sound only when x is not (a view of) an input: the product might
    reach an output through views, which would then alias the input (check_fx_pass found that in a
    first version that only refused a product returned directly); when nothing else reads x (else
    two outputs could become one tensor); and when x has the product's strides (an expanded x would
    make a later view fail); and when x is computed, not a module constant (the output would be
    the constant itself)."""
    inputs = {_storage(p) for p in gm.graph.find_nodes(op="placeholder")}
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.mul.Tensor)):
        x, c = node.args
        if type(c) is not int or c != 1 or not isinstance(x, torch.fx.Node) or x.op != "call_function" \
                or _storage(x) in inputs or len(x.users) > 1:
            continue
        old, new = x.meta["val"], node.meta["val"]
        if new.dtype in (torch.int64, torch.int32, torch.int8) and old.dtype == new.dtype \
                and old.shape == new.shape and old.stride() == new.stride():
            node.replace_all_uses_with(x)
            gm.graph.erase_node(node)


@pytest.mark.parametrize("pass_fn", [identity, rebuild, dead_code, cse])
def test_sound_passes_pass_on_static_graphs(pass_fn):
    # cse changes few random graphs (duplicates are rare): min_changed=0 accepts that (issue 30).
    report = check_fx_pass(pass_fn, examples=30, focus=pass_fn is cse, min_changed=0)
    assert report.graphs == 30 and report.runs == 30 and report.invalid == 0
    assert "ok on 30 random static graphs" in str(report)



def test_a_correct_integer_mul_one_pass_passes_and_changes_graphs():
    report = check_fx_pass(mul_one_ints, examples=100, dtypes=(torch.int64, torch.int32, torch.int8),
                           ops=["mul_scalar", "neg", "expand", "view"])
    assert report.changed > 0


@pytest.mark.parametrize("pass_fn", [identity, cse])
def test_sound_passes_pass_on_dynamic_graphs(pass_fn):
    report = check_fx_pass(pass_fn, examples=20, dynamic=True, focus=False)
    assert report.runs > report.graphs and report.invalid == 0  # several sizes per graph


def test_graph_passes_get_the_graph():
    seen = []

    def on_graph(graph):
        seen.append(type(graph))
        graph.eliminate_dead_code()

    check_fx_pass(on_graph, examples=5, takes="graph", focus=False)
    assert set(seen) == {torch.fx.Graph}


def test_inductor_custom_graph_passes_are_called_with_the_graph():
    # What config.post_grad_custom_pre_pass / post_grad_custom_post_pass hold: Inductor calls them
    # with gm.graph, and so does check_fx_pass.
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class DropClone(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            for node in list(graph.find_nodes(op="call_function", target=aten.clone.default)):
                node.replace_all_uses_with(node.args[0])
                graph.erase_node(node)

        def uuid(self):
            return "drop-clone"

    with pytest.raises(AssertionError, match=r"DropClone is unsound: output \d is input"):
        check_fx_pass(DropClone(), examples=40, ops=["clone"], shrink_seconds=5)


# -- the graphs passes get -----------------------------------------------------------------------

@settings(max_examples=25, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(fx_cases(dynamic=False))
def test_static_graphs_carry_fake_tensor_metadata(case: FxCase):
    for node in case.gm.graph.nodes:
        if node.op in ("placeholder", "call_function", "get_attr"):
            val = node.meta["val"]
            if isinstance(val, torch.Tensor):
                assert isinstance(val, torch._subclasses.FakeTensor)
                assert node.meta["tensor_meta"].shape == val.shape


@settings(max_examples=25, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(fx_cases(dynamic=True))
def test_dynamic_graphs_have_symbolic_sizes_shared_across_inputs(case: FxCase):
    placeholders = case.gm.graph.find_nodes(op="placeholder")
    symbols = {str(s.node.expr) for p in placeholders for s in p.meta["val"].shape if isinstance(s, torch.SymInt)}
    assert len(symbols) == len(case.trace_sizes)  # one symbol per size name the program uses
    for spec, p in zip(case.inputs, placeholders):
        assert len(spec.dims) == p.meta["val"].dim()
        assert all(isinstance(s, torch.SymInt) == isinstance(d, str) for s, d in zip(p.meta["val"].shape, spec.dims))
    constraints = SizeConstraints(case.gm)
    assert constraints.allows(case.shapes(case.trace_sizes), [s.dtype for s in case.inputs])


def test_dynamic_graphs_use_size_arithmetic_and_shared_symbols():
    seen = {"sym_size": 0, "arith": 0, "shared": 0, "guards": 0, "not at 7": 0}

    @settings(max_examples=60, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(fx_cases(dynamic=True))
    def run(case):
        targets = [n.target for n in case.gm.graph.nodes if n.op == "call_function"]
        seen["sym_size"] += aten.sym_size.int in targets
        seen["arith"] += any(t in (operator.mul, operator.add, operator.sub, operator.floordiv) for t in targets)
        seen["shared"] += len({d for s in case.inputs for d in s.dims if isinstance(d, str)}) < \
            sum(isinstance(d, str) for s in case.inputs for d in s.dims)
        constraints = SizeConstraints(case.gm)
        seen["guards"] += bool(constraints.shape_env.guards)
        sizes = {s: 7 for s in case.trace_sizes}  # odd: a split by 2 or 3 (divisibility guard) refuses it
        seen["not at 7"] += not constraints.allows(case.shapes(sizes), [s.dtype for s in case.inputs])

    run()
    assert all(v >= 5 for k, v in seen.items() if k != "not at 7") and seen["not at 7"] >= 1, seen


# -- the pytest and CLI forms --------------------------------------------------------------------

def test_fx_pass_test_turns_a_pass_into_a_test():
    @fx_pass_test(examples=5, focus=False)
    def test_identity(gm):
        return None

    assert test_identity.__name__ == "test_identity" and test_identity.pass_fn.__name__ == "test_identity"
    test_identity()  # what pytest would call: no arguments
    drop_clone = rewrite_calls(aten.clone.default, lambda g, n: n.args[0], "drop_clone")
    with pytest.raises(AssertionError, match="drop_clone is unsound"):
        fx_pass_test(drop_clone, examples=60, ops=["clone"])()


@pytest.fixture
def pass_module(tmp_path, monkeypatch):
    (tmp_path / "user_passes_for_test.py").write_text(textwrap.dedent("""
        import torch
        aten = torch.ops.aten

        def identity(gm):
            return gm

        def fold_mul_zero(gm):
            for node in list(gm.graph.find_nodes(op="call_function", target=aten.mul.Tensor)):
                if node.args[1] == 0:
                    with gm.graph.inserting_before(node):
                        zeros = gm.graph.call_function(aten.zeros_like.default, (node.args[0],))
                    node.replace_all_uses_with(zeros)
                    gm.graph.erase_node(node)

        NOT_A_PASS = 3
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "user_passes_for_test"
    sys.modules.pop("user_passes_for_test", None)


def test_cli_check_pass_exit_codes(pass_module, capsys):
    assert cli_main(["check-pass", f"{pass_module}:identity", "--examples", "5"]) == 0
    assert "identity: ok on" in capsys.readouterr().out
    assert cli_main(["check-pass", f"{pass_module}:fold_mul_zero", "--examples", "50", "--ops", "mul_scalar", "neg",
                     "--dtypes", "float32"]) == 1
    out = capsys.readouterr().out
    assert "fold_mul_zero is unsound" in out and "graph before the pass (FX code):" in out
    for spec, why in [(f"{pass_module}:missing", "has no attribute 'missing'"),
                      ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
                      (pass_module, "module:function"), (f"{pass_module}:NOT_A_PASS", "not a callable")]:
        assert cli_main(["check-pass", spec]) == 2
        err = capsys.readouterr().err
        assert why in err and "Traceback" not in err
    assert cli_main(["check-pass", f"{pass_module}:identity", "--ops", "nonsense"]) == 2
    assert "unknown op 'nonsense'" in capsys.readouterr().err


def test_load_pass_names_the_problem():
    assert load_pass("rewrite.testing:check_fx_pass") is check_fx_pass
    with pytest.raises(ValueError, match="module:function"):
        load_pass("rewrite.testing.check_fx_pass")


# -- the docs/testing.md example -----------------------------------------------------------------

def fold_mul_zero(gm):  # x * 0 -> zeros_like(x), as in docs/testing.md
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.mul.Tensor)):
        if node.args[1] == 0:
            with gm.graph.inserting_before(node):
                node.replace_all_uses_with(gm.graph.call_function(aten.zeros_like.default, (node.args[0],)))
            gm.graph.erase_node(node)


def fold_int_mul_zero(gm):  # only for integer products, in the product's dtype, as in docs/testing.md
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.mul.Tensor)):
        dtype = node.meta["val"].dtype
        if node.args[1] == 0 and not dtype.is_floating_point:
            with gm.graph.inserting_before(node):
                zeros = gm.graph.call_function(aten.full_like.default, (node.args[0], 0), {"dtype": dtype})
            node.replace_all_uses_with(zeros)
            gm.graph.erase_node(node)


def test_readme_example_finds_the_unsound_pass_and_passes_the_sound_one():
    message = failure(fold_mul_zero, examples=100)
    assert re.search(r"expected (-0\.0|nan), got 0\.0", message)
    assert "torch.ops.aten.zeros_like.default" in graph_after(message)
    assert_small(message, max_ops=1)
    report = check_fx_pass(fold_int_mul_zero, examples=50)
    assert report.changed > 0 and "mul_scalar" in report.focus


def div_to_reciprocal_mul(gm):  # x / c -> x * (1/c): unsound (1/3 rounds), and skips c == 0 as a careful pass would
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.div.Tensor)):
        c = node.args[1]
        if isinstance(c, (int, float)) and not isinstance(c, bool) and c != 0:
            with gm.graph.inserting_before(node):
                product = gm.graph.call_function(aten.mul.Tensor, (node.args[0], 1.0 / c))
            node.replace_all_uses_with(product)
            gm.graph.erase_node(node)


def div_by_power_of_two_to_mul(gm):  # x / 2**k -> x * 2**-k: sound (both round the same real number)
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.div.Tensor)):
        c = node.args[1]
        if type(c) is float and c != 0 and math.isfinite(c) and math.frexp(abs(c))[0] == 0.5:
            with gm.graph.inserting_before(node):
                product = gm.graph.call_function(aten.mul.Tensor, (node.args[0], 1.0 / c))
            node.replace_all_uses_with(product)
            gm.graph.erase_node(node)


def test_default_settings_catch_a_reciprocal_pass_that_skips_zero_divisors():
    # Issue 30: with the probe's first scalar 0.0 skipped by the pass, it looked like it changed nothing.
    message = failure(div_to_reciprocal_mul)
    assert "is unsound" in message and "torch.ops.aten.div.Tensor" in message.split("graph after the pass")[0]
    assert "torch.ops.aten.mul.Tensor" in graph_after(message)


def test_a_pass_that_changes_few_graphs_gets_more_drawn_around_its_ops():
    report = check_fx_pass(div_by_power_of_two_to_mul, examples=30)
    assert "div_scalar" in report.focus and report.changed >= 20 and report.extra > 0, str(report)
    assert "more graphs drawn around those ops" in str(report)


def test_too_few_changed_graphs_is_a_failure_saying_so():
    with pytest.raises(AssertionError, match=r"inconclusive: the pass changed only \d+ of \d+ random graphs.*"
                                             r"min_changed=100.*min_changed=0"):
        check_fx_pass(div_by_power_of_two_to_mul, examples=5, min_changed=100)
    with pytest.raises(ValueError, match="min_changed=-1 must be an int >= 0"):
        check_fx_pass(div_by_power_of_two_to_mul, min_changed=-1)
