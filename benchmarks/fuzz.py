"""Property-based pass checking: how fast graphs are drawn and checked, and what it finds in Inductor.

    .venv/bin/python benchmarks/fuzz.py [--examples 200] [--dynamic-examples 100]

* throughput: `check_fx_pass` with an identity pass (``focus=False``), static and dynamic-shape
  graphs: graphs per second for drawing + lowering to FX (make_fx, core ATen) + running before and
  after + comparing; dynamic graphs run at up to 3 sizes each;
* findings: `check_fx_pass` over Inductor's own graph passes that take a plain GraphModule or
  Graph, on the graphs they see (``decompositions="inductor"``), static and dynamic: sound (how
  many graphs the pass changed) or the first line of the shrunk counterexample.

Prints a table and writes the "fuzz" section of benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks._results import machine_line, markdown_table, record_section  # noqa: E402
from rewrite.testing import check_fx_pass  # noqa: E402


def identity(gm):
    return None


def inductor_passes() -> list[tuple[str, object, dict]]:
    """(name, pass, check_fx_pass options) for Inductor passes callable on a plain graph."""
    import torch._inductor.config as config
    from torch._inductor.fx_passes import joint_graph, post_grad
    from torch._inductor.fx_passes.split_cat import construct_pattern_matcher_pass

    import torch._inductor.fx_passes.decompose_mem_bound_mm as decompose  # registers its patterns

    def post_grad_pipeline(gm):
        post_grad.post_grad_passes(gm, is_inference=True)

    def decompose_mm_pass(graph):
        """mm/bmm/addmm -> pointwise mul + sum. On CPU only for a first dimension <= 1 by default:
        raised to 64 here so the random (small) matrices are all decomposed."""
        saved = decompose.cpu_max_first_dimension_decomposition
        decompose.cpu_max_first_dimension_decomposition = 64
        try:
            with config.patch(post_grad_fusion_options={"decompose_mm_pass": {}}):
                construct_pattern_matcher_pass("decompose_mm_pass").apply(graph)
        finally:
            decompose.cpu_max_first_dimension_decomposition = saved

    graph = dict(takes="graph")
    return [
        ("post_grad.remove_noop_ops", post_grad.remove_noop_ops, graph),
        ("post_grad.reorder_for_locality", post_grad.reorder_for_locality, graph),
        ("post_grad.view_to_reshape", post_grad.view_to_reshape, {}),
        ("post_grad.post_grad_passes (inference)", post_grad_pipeline, {}),
        # Only float graphs with a matrix product say anything about it.
        ("decompose_mem_bound_mm (decompose_mm_pass), ops mm", decompose_mm_pass,
         dict(graph, tolerance="dtype", dtypes=[torch.float32], ops={False: ["mm", "neg"], True: ["matmul", "neg"]})),
        ("joint_graph.constant_fold_uniform_value", joint_graph.constant_fold_uniform_value, {}),
        # The same, drawn around what it folds: products with a literal, sums with a zeros tensor.
        ("joint_graph.constant_fold_uniform_value, ops mul_scalar", joint_graph.constant_fold_uniform_value,
         dict(dtypes=[torch.float32], ops=["mul_scalar"])),
        ("joint_graph.constant_fold_uniform_value, ops zeros_like/fill + add", joint_graph.constant_fold_uniform_value,
         dict(dtypes=[torch.float32], ops={False: ["zeros_like", "add"], True: ["fill", "add"]})),
        ("joint_graph.remove_redundant_views", joint_graph.remove_redundant_views, {}),
        ("joint_graph.joint_graph_passes", joint_graph.joint_graph_passes, {}),
    ]


def run(pass_fn, **options) -> tuple[str, float]:
    start = time.perf_counter()
    try:
        report = check_fx_pass(pass_fn, **options)
    except AssertionError as e:
        first = str(e).splitlines()[0].split(" is unsound: ", 1)[-1]
        return f"**unsound**: {first}", time.perf_counter() - start
    return f"sound on {report.graphs} graphs ({report.changed} changed)", time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200, help="static graphs per check")
    parser.add_argument("--dynamic-examples", type=int, default=100, help="dynamic-shape graphs per check")
    args = parser.parse_args()

    rows = []
    for dynamic, n in ((False, args.examples), (True, args.dynamic_examples)):
        report = check_fx_pass(identity, examples=n, dynamic=dynamic, focus=False)
        rows.append(["dynamic" if dynamic else "static", report.graphs, report.runs, f"{report.seconds:.1f}",
                     f"{report.graphs_per_second:.1f}", f"{report.runs / report.seconds:.1f}"])
        print(rows[-1], flush=True)
    throughput = markdown_table(["graphs", "checked", "runs compared", "seconds", "graphs/s", "runs/s"], rows)

    findings = []
    for name, pass_fn, options in inductor_passes():
        for dynamic, n in ((False, args.examples), (True, args.dynamic_examples)):
            mode = {k: v[dynamic] if isinstance(v, dict) else v for k, v in options.items()}
            verdict, seconds = run(pass_fn, examples=n, dynamic=dynamic, decompositions="inductor", **mode)
            findings.append([name, "dynamic" if dynamic else "static", verdict, f"{seconds:.0f}"])
            print(findings[-1], flush=True)
    found = markdown_table(["Inductor pass", "graphs", "check_fx_pass says", "s"], findings)

    body = "\n\n".join([
        "## Property-based pass checking (check_fx_pass)",
        f"`.venv/bin/python benchmarks/fuzz.py --examples {args.examples} --dynamic-examples "
        f"{args.dynamic_examples}`; {machine_line()}. The machine is shared: figures are lower bounds.",
        "Throughput with an identity pass: drawing a graph, lowering it to FX (make_fx, core ATen "
        "decompositions, FakeTensor metadata), running it before and after on seasoned inputs, "
        "comparing outputs, mutations and aliasing. Dynamic graphs are random programs traced with "
        "symbolic sizes and run at up to 3 sizes their guards allow.",
        throughput,
        "Inductor's own passes on the graphs they see (`decompositions=\"inductor\"`), default options "
        "unless the row names ops (then float32 graphs drawn from those op generators only); bit for "
        "bit, except the mm decomposition, compared within the dtype tolerance since it sums in "
        "another order, with its CPU size limit raised so small products are decomposed. A "
        "counterexample's first line is shown; tests/test_fx_pass_inductor.py pins the findings and "
        "docs/testing.md shows them end to end through torch.compile.",
        found,
        "What the unsound rows mean (checked by hand): `constant_fold_uniform_value` folds float `x * 0` "
        "(integer literal 0) to 0 (eager: NaN for NaN/inf, -0.0 for negatives) and `x + zeros` to `x` "
        "(-0.0 kept, and a returned sum becomes the input itself); both reach users of "
        "`torch.compile` (docs/testing.md). `remove_noop_ops` (and the post-grad pipeline that runs it) turns "
        "a returned `clone(self._tensor_constant0)` into the constant itself, so a GraphModule run "
        "directly hands its constant to the caller; through `torch.compile` (with and without "
        "freezing) the returned tensor stayed fresh when we tried, so this one is a pass-contract "
        "violation, not a user-visible bug.",
    ])
    record_section("fuzz", body)
    print(body)


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
