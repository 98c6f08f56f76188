"""Property-based checking for rules and passes, built on hypothesis.

A rewrite is only worth having if it never changes a result, and the cases that break rewrites
(NaN, +-inf, -0.0, the extreme integers, odd layouts) are the ones hand-written tests forget. So
this package draws them on purpose:

* `strategies`: `graphs()` draws random valid `Graph`s over the ops in `OPS`; `graph_inputs(graph)`
  draws inputs for one, seasoned with those special values; `tensors`, `make_tensor`,
  `special_values` and `infer_meta` are the parts they are made of;
* `equivalence`: `assert_equivalent(before, after)` runs a graph before and after a pass on the
  same inputs, on the executor compiled graphs use, and raises an AssertionError naming the input,
  the output and the elements that differ;
* `rule_checking`: `check_rule(rule)` / `check_ruleset_module(name)` instantiate a rule's pattern
  with random shapes, dtypes and values that satisfy its conditions and compare both sides bit for
  bit (NaN matches NaN, -0.0 must stay -0.0), printing a counterexample when they differ;
* `backends`: `check_backend(fn, *inputs, backend=...)` checks a whole compiler: the function's
  graphs are saturated with the rule library, several equivalent graphs are extracted from the
  e-graph (`variants`), each is compiled by the backend (`targets`: Inductor, rewrite, any
  torch.compile backend) and compared with eager on drawn inputs; a disagreement is shrunk and
  written as a standalone script (`repro`); `check_graphs` runs it over many graphs (a campaign);
* `fx_pass`: `check_fx_pass(pass_fn)` does the same for any torch.fx pass (Inductor style or
  not) on random graphs lowered to FX with FakeTensor metadata (`fx_graphs`), static or with
  symbolic sizes (`dynamic`: random programs traced by make_fx, run at several valid sizes),
  comparing outputs, input mutations and aliasing; `fx_pass_test` makes a pytest test of it.

Checking a rule of your own::

    from rewrite.dsl import aten, is_float, rule, variables
    from rewrite.testing import check_rule
    x, = variables("x")
    check_rule(rule(aten.mul.Tensor(x, 0.0), aten.zeros_like.default(x), when=[is_float(x)]))
    # AssertionError: rule ... is unsound: ... expected -0.0, got 0.0
    # counterexample:  x = float16[]: -0.0

``python -m rewrite check-rules mypkg.my_rules`` does the same for every rule of a module, and
``python -m rewrite check-pass mypkg.passes:my_pass`` checks an FX pass (see `check_fx_pass`).
"""
from . import needs  # noqa: F401  (first: without hypothesis, the error names the extra that installs it)

from .equivalence import (
    assert_equivalent, compare_outputs, compare_tensors, describe_inputs, input_aliases, run_graph, tolerance,
)
from .backends import (
    BackendCheckReport, BackendMismatch, Finding, GraphCase, capture_graphs, case_from_graph, case_from_program,
    check_backend, check_graphs,
)
from .fx_graphs import FxCase, fx_cases, lower_graph
from .fx_pass import PassCheckReport, check_fx_pass, fx_pass_test, load_pass
from .rule_checking import (
    SCALAR_CANDIDATES, ModuleCheckReport, RuleCheckReport, check_rule, check_ruleset, check_ruleset_module,
)
from .targets import CAMPAIGN_TARGETS, TARGETS, Target, target_for
from .variants import Variant, equivalent_variants
from .strategies import (
    ALL_DTYPES, FILL_OPS, FLOAT_DTYPES, GRAPH_DTYPES, INT_DTYPES, MAX_DIM, MAX_RANK, OPS, OpGen, fuzz_examples,
    graph_inputs, graphs, infer_meta, make_tensor, permutations_of, reshapes, shape_of, shapes, special_values,
    tensors,
)

__all__ = [
    "FLOAT_DTYPES",
    "INT_DTYPES",
    "ALL_DTYPES",
    "OPS",
    "FILL_OPS",
    "tensors",
    "graphs",
    "graph_inputs",
    "run_graph",
    "compare_outputs",
    "assert_equivalent",
    "check_rule",
    "check_ruleset",
    "check_ruleset_module",
    "RuleCheckReport",
    "ModuleCheckReport",
    "fuzz_examples",
    "make_tensor",
    "special_values",
    "infer_meta",
    "compare_tensors",
    "check_fx_pass",
    "fx_pass_test",
    "PassCheckReport",
    "load_pass",
    "fx_cases",
    "FxCase",
    "lower_graph",
    "describe_inputs",
    "input_aliases",
    "check_backend",
    "check_graphs",
    "capture_graphs",
    "BackendCheckReport",
    "BackendMismatch",
    "Finding",
    "GraphCase",
    "case_from_graph",
    "case_from_program",
    "Target",
    "TARGETS",
    "CAMPAIGN_TARGETS",
    "target_for",
    "Variant",
    "equivalent_variants",
]
