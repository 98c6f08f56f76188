"""TorchAir's config and graph-dump tests (tests/st/torchair_st.py), ported, and its user FX pass
hooks (``post_grad_custom_pre_pass`` / ``post_grad_custom_post_pass``). TorchAir reads its own logger
and GE dump files; these read the ``rewrite`` logger, rewrite's dump files and the compiled graphs.
Not ported (NPU-only: data dump, AOE, fusion switch files): test_set_error_option_path,
test_set_error_static_model_ops_lower_limit, test_set_option, test_fx_data_dump_*,
test_fx_dump_config_path, test_fx_dumper, test_auto_tune, test_print_ge_stream_allocation_summary.
"""
from __future__ import annotations

import logging
import re

import pytest
import torch

import rewrite
import rewrite.compat.torchair as torchair
from rewrite.testing import check_fx_pass

aten = torch.ops.aten
PHRASES = [f"[forward] {when} [{field}] execution" for field in ("post_grad_custom_pre_pass", "post_grad_custom_post_pass")
           for when in ("before", "after")]


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.add(torch.mm(x, x), torch.sub(torch.abs(x), torch.add(x, 1)))


def _debug_lines(fn) -> list[str]:
    """The messages the ``rewrite`` logger emits at DEBUG while ``fn`` runs."""
    lines: list[str] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("rewrite")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        fn()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return lines


def test_post_grad_no_custom_fn():
    """mirrors torchair_st.py::test_post_grad_no_custom_fn: no pass set, no pass logs."""
    compiled = torch.compile(Model(), backend=torchair.get_npu_backend(compiler_config=torchair.CompilerConfig()),
                             dynamic=True)
    lines = _debug_lines(lambda: compiled(torch.randn(2, 2)))
    assert not any(phrase in line for line in lines for phrase in PHRASES)


def test_post_grad_custom_fn():
    """mirrors torchair_st.py::test_post_grad_custom_fn: TorchAir-style passes (gm, example_inputs,
    config) returning None are run, and logged before and after."""
    calls = []
    config = torchair.CompilerConfig()
    config.post_grad_custom_pre_pass = lambda gm, example_inputs, cfg: calls.append(("pre", len(example_inputs), cfg))
    config.post_grad_custom_post_pass = lambda gm, example_inputs, cfg: calls.append(("post", len(example_inputs), cfg))
    compiled = torch.compile(Model(), backend=torchair.get_npu_backend(compiler_config=config), dynamic=True)
    x = torch.randn(2, 2)
    lines = _debug_lines(lambda: torch.testing.assert_close(compiled(x), Model()(x)))
    for phrase in PHRASES:
        assert any(phrase in line for line in lines), phrase
    assert [c[0] for c in calls] == ["pre", "post"]
    assert all(isinstance(c[2], rewrite.CompilerConfig) for c in calls)


def test_post_grad_passes_run_before_and_after_the_optimizer():
    """The pre pass sees the AOT graph before rewrite's rules (its x*1 is then removed by them); the
    post pass sees the optimized graph with meta['val'] on every node and its edits are compiled."""
    seen = {}

    def pre(gm):  # a torch.fx pass: gm -> None (in place)
        for node in list(gm.graph.find_nodes(op="call_function", target=aten.abs.default)):
            with gm.graph.inserting_after(node):
                mul = gm.graph.call_function(aten.mul.Tensor, (node, 1))
            node.replace_all_uses_with(mul)
            mul.args = (node, 1)

    def post(gm):  # returns a new module: abs -> neg (so the result shows the pass ran)
        seen["vals"] = [n.meta.get("val") for n in gm.graph.nodes if n.op == "call_function"]
        seen["ops"] = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        for node in gm.graph.find_nodes(op="call_function", target=aten.abs.default):
            node.target = aten.neg.default
        gm.recompile()
        return gm

    config = rewrite.CompilerConfig()
    config.post_grad_custom_pre_pass = pre
    config.post_grad_custom_post_pass = post
    backend = rewrite.get_backend(config)
    x = torch.randn(3, 3)
    out = torch.compile(Model(), backend=backend, dynamic=True)(x)
    torch.testing.assert_close(out, torch.mm(x, x) + (-x - (x + 1)))
    assert backend.report.graphs[0].ops_before.get("aten.mul.Tensor") == 1  # the pre pass's node was imported
    assert "aten.mul.Tensor" not in seen["ops"]  # ... and removed by the optimizer before the post pass
    assert all(isinstance(v, torch.Tensor) for v in seen["vals"])
    assert backend.report.graphs[0].ops_after.get("aten.neg.default") == 1


class _InductorStylePass:
    """An Inductor CustomGraphPass (called with gm.graph, edits in place)."""

    def __new__(cls):
        from torch._inductor.custom_graph_pass import CustomGraphPass

        class Pass(CustomGraphPass):
            def __call__(self, graph):
                for node in graph.find_nodes(op="call_function", target=aten.abs.default):
                    node.target = aten.neg.default

            def uuid(self):
                return "neg"

        return Pass()


def test_post_grad_inductor_custom_graph_pass():
    """Inductor's CustomGraphPass objects are called with gm.graph, as Inductor calls them."""
    config = rewrite.CompilerConfig()
    config.post_grad_custom_post_pass = _InductorStylePass()
    x = torch.randn(3, 3)
    out = torch.compile(Model(), backend=rewrite.get_backend(config))(x)
    torch.testing.assert_close(out, torch.mm(x, x) + (-x - (x + 1)))


@pytest.mark.parametrize("field", ["post_grad_custom_pre_pass", "post_grad_custom_post_pass"])
def test_post_grad_pass_that_breaks_the_graph_is_named(field):
    """A pass that raises or leaves a malformed graph is a CompileError naming the field and the pass."""
    def erase_a_used_node(gm):
        node = next(iter(gm.graph.find_nodes(op="call_function", target=aten.mm.default)))
        node.replace_all_uses_with(gm.graph.find_nodes(op="placeholder")[-1])
        gm.graph.erase_node(node)
        gm.graph.output_node().args = ((node,),)  # refers to an erased node

    config = rewrite.CompilerConfig()
    config.set_path(field, erase_a_used_node)
    compiled = torch.compile(Model(), backend=rewrite.get_backend(config))
    with pytest.raises(Exception, match=rf"config\.{field} \(.*erase_a_used_node\) failed"):
        compiled(torch.randn(3, 3))


def test_post_grad_pass_must_be_callable():
    config = rewrite.CompilerConfig()
    with pytest.raises(rewrite.ConfigError, match="post_grad_custom_pre_pass.*expected a callable"):
        config.post_grad_custom_pre_pass = "not a pass"


def _through_post_grad_hooks(user_pass):
    """rewrite's hook path as one FX pass: user_pass as post_grad_custom_pre_pass on the graph, import
    to the IR, back to FX with meta['val'] (stream tags and waits in node meta), user_pass as
    post_grad_custom_post_pass, import again, and out as FX to run."""
    from rewrite.fx_bridge import to_fx
    from rewrite.unit import CompileUnit
    from rewrite.user_passes import run_post_pass, run_pre_pass

    def hook_path(gm):
        config = rewrite.CompilerConfig()
        config.post_grad_custom_pre_pass = user_pass
        config.post_grad_custom_post_pass = user_pass
        unit = CompileUnit.detached("g0_inference", config)
        graph = run_pre_pass(gm, None, unit, unit.name)
        return to_fx(run_post_pass(graph, gm, None, unit))

    return hook_path


def _fold_mul_zero(gm):  # unsound: x * 0 is NaN for x = inf, -0.0 for x < 0
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.mul.Tensor)):
        if node.args[1] == 0:
            with gm.graph.inserting_before(node):
                zeros = gm.graph.call_function(aten.zeros_like.default, (node.args[0],))
            node.replace_all_uses_with(zeros)
            gm.graph.erase_node(node)


def _negate_twice(gm, example_inputs, config):  # sound, TorchAir's shape: -(-x) for each abs
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.abs.default)):
        with gm.graph.inserting_after(node):
            neg = gm.graph.call_function(aten.neg.default, (node,))
        with gm.graph.inserting_after(neg):
            back = gm.graph.call_function(aten.neg.default, (neg,))
        node.replace_all_uses_with(back)
        neg.args, back.args = (node,), (neg,)


@pytest.mark.parametrize("dynamic", [False, True])
def test_check_fx_pass_through_the_post_grad_hook_path(dynamic):
    """issue 16: check_fx_pass over rewrite's post_grad_custom_* hook path. A sound pass (new nodes
    without meta['val'], TorchAir's three arguments) stays sound through it, static and with symbolic
    sizes; an unsound one is still caught with a counterexample."""
    report = check_fx_pass(_through_post_grad_hooks(_negate_twice), examples=25, dynamic=dynamic, seed=1)
    assert report.ok
    with pytest.raises(AssertionError, match="unsound"):
        check_fx_pass(_through_post_grad_hooks(_fold_mul_zero), examples=40, seed=1, ops=["mul_scalar"])


def test_dump_node_info(tmp_path):
    """mirrors torchair_st.py::test_dump_node_info: the py dump shows every node's dtype and symbolic
    shape, its inputs' too (TorchAir: ``add: torch.float32[s0, s0]cpu``; rewrite: ``%add: f32[s77, s77]``).
    Regression (issue 15): only the graph inputs had them."""
    config = torchair.CompilerConfig()
    config.debug.graph_dump.type = "py"
    config.debug.graph_dump.path = str(tmp_path / "test_dump_node_info" / "graphs")
    compiled = torch.compile(lambda x, y, z: torch.add(input=x, other=y, alpha=z),
                             backend=torchair.get_npu_backend(compiler_config=config), dynamic=True)
    compiled(torch.randn(4, 4), torch.randn(4, 4), 1)
    before = next((tmp_path / "test_dump_node_info" / "graphs").glob("*_before.py")).read_text()
    line = next(line for line in before.splitlines() if line.startswith("## %add"))
    assert re.search(r"%add: f32\[(s\d+), \1\] = aten\.add\.Tensor\(%arg\d_1: f32\[\1, \1\], %arg\d_1: f32\[\1, \1\]",
                     line), line


def test_directory_generation(tmp_path):
    """mirrors torchair_st.py::test_directory_generation: a missing nested folder is created; one file
    before and one after optimization for the graph, with the same graph number, rank and pid."""
    config = torchair.CompilerConfig()
    config.debug.graph_dump.type = "pbtxt"
    folder = tmp_path / "test_directory_generation" / "dir"
    config.debug.graph_dump.path = str(folder)
    torch.compile(lambda x, y: x + y, backend=torchair.get_npu_backend(compiler_config=config))(
        torch.randn(2, 2), torch.randn(2, 2))
    files = sorted(p.name for p in folder.iterdir())
    assert len(files) == 2, files
    parsed = [re.fullmatch(r"rewrite_graph_(\d+)_rank_(\d+)_pid_(\d+)_\w+_(before|after)\.pbtxt", f) for f in files]
    assert all(parsed) and {m.group(4) for m in parsed} == {"before", "after"}
    assert len({m.groups()[:3] for m in parsed}) == 1


def test_ge_graph_dump_with_py(tmp_path):
    """mirrors torchair_st.py::test_ge_graph_dump_with_py and torchair_aclgraph_st.py::test_graph_dump_with_py
    (in reduce-overhead mode too: rewrite dumps every type in every mode): the py dump is more than
    a header and holds the ATen call."""
    for mode in ("max-autotune", "reduce-overhead"):
        config = torchair.CompilerConfig()
        config.mode = mode
        config.debug.graph_dump.type = "py"
        config.debug.graph_dump.path = str(tmp_path / mode)
        torch.compile(lambda x: x + 1, backend=torchair.get_npu_backend(compiler_config=config))(torch.randn(2, 2))
        text = next((tmp_path / mode).glob("*_before.py")).read_text()
        assert "aten.add.Tensor(%arg0_1" in text and "def " in text


def test_check_config_support():
    """mirrors torchair_st.py::test_check_config_support (the mode values): max-autotune,
    reduce-overhead and npugraph_ex are accepted; anything else is a ConfigError naming them."""
    config = torchair.CompilerConfig()
    for mode in ("reduce-overhead", "npugraph_ex", "max-autotune"):
        config.mode = mode
    with pytest.raises(rewrite.ConfigError, match="'max-autotune', 'reduce-overhead', 'npugraph_ex'"):
        config.mode = "aclgraph"


@pytest.mark.skip(reason="NPU-only: data dump, AOE and fusion-switch options (dump_config, aoe_config, fusion_config, "
                         "debug.data_dump, experimental_config.static_model_ops_lower_limit)")
def test_set_error_option_path():
    """mirrors torchair_st.py::test_set_error_option_path, test_set_error_static_model_ops_lower_limit,
    test_set_option, test_fx_data_dump_*, test_fx_dump_config_path, test_fx_dumper, test_auto_tune"""
