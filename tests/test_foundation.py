"""The IR, the FX bridge, the executor, the config, graph dumps and explain."""
import os

import pytest
import sympy
import torch

import rewrite
from rewrite.config import ConfigError
from rewrite.exec.codegen import compile_graph_to_python
from rewrite.fx_bridge import CompileError, from_fx, to_fx
from rewrite.ir import Graph, SymMeta, TensorMeta


def _capture(fn, *args, dynamic_dims=()):
    """The AOT core-ATen graph rewrite would compile for fn(*args), as an FX GraphModule."""
    captured = []

    class Capture(rewrite.backend.RewriteBackend):
        def compile_graph(self, gm, *rest):
            captured.append(gm)
            return super().compile_graph(gm, *rest)

    for arg, dim in dynamic_dims:
        torch._dynamo.mark_dynamic(arg, dim)
    torch.compile(fn, backend=Capture(), fullgraph=True)(*args)
    return captured[0]


def test_config_rejects_unknown_fields_and_values():
    config = rewrite.CompilerConfig()
    config.mode = "reduce-overhead"
    config.inference_config.dynamic_gears_merge_policy = "product"
    with pytest.raises(ConfigError, match="no field 'mod'.*known fields"):
        config.mod = "reduce-overhead"
    with pytest.raises(ConfigError, match="choose one of"):
        config.mode = "fast"
    with pytest.raises(ConfigError, match="'zip', 'product'"):
        config.inference_config.dynamic_gears_merge_policy = "cartesian"
    with pytest.raises(ConfigError, match="txt"):
        config.debug.graph_dump.type = "json"
    with pytest.raises(ConfigError, match="expected bool"):
        config.exec.auto_streams = "yes"
    with pytest.raises(TypeError, match="CompilerConfig"):
        rewrite.get_backend(compiler_config={"mode": "max-autotune"})


def test_ir_from_fx_keeps_shapes_and_prints_readably():
    gm = _capture(lambda x, w: torch.relu(x @ w).sum(-1), torch.randn(4, 8), torch.randn(8, 3),
                  dynamic_dims=[])
    g = from_fx(gm)
    text = str(g)
    assert "aten.mm.default" in text and "aten.relu.default" in text and "f32[4, 3]" in text
    out = g.outputs[0]
    assert out.meta == TensorMeta(torch.float32, (sympy.Integer(4),), torch.device("cpu"))
    g.validate()


def test_ir_symbolic_shapes_and_symbols():
    x = torch.randn(6, 8)
    gm = _capture(lambda x: (x * 2).view(-1), x, dynamic_dims=[(x, 0)])
    g = from_fx(gm)
    assert g.symbols, "a dynamic dim must become a size symbol"
    sym = next(iter(g.symbols))
    info = g.symbols[sym]
    tensor_input = g.placeholders[info.input_index]
    assert tensor_input.meta.shape[info.dim] == sym
    assert g.outputs[0].meta.shape == (8 * sym,)
    assert any(isinstance(p.meta, SymMeta) for p in g.placeholders) or info.input_index is not None


def test_ir_round_trips_through_fx_and_codegen():
    gm = _capture(lambda x, y: torch.softmax(x + y, -1) * 3, torch.randn(3, 5), torch.randn(5))
    g = from_fx(gm)
    back = to_fx(g)
    args = (torch.randn(3, 5), torch.randn(5))
    expected = torch.softmax(args[0] + args[1], -1) * 3
    torch.testing.assert_close(back(*args)[0], expected)
    torch.testing.assert_close(compile_graph_to_python(g)(*args)[0], expected)
    copy = g.copy()
    assert str(copy) == str(g) and copy.nodes[0] is not g.nodes[0]
    copy.nodes[0].attrs["stream"] = "s1"  # attributes are the copy's own (the export's pbtxt dump edits a copy's)
    assert "stream" not in g.nodes[0].attrs


def test_generated_code_is_straight_line_aten_calls():
    gm = _capture(lambda x: torch.tanh(x) + 1, torch.randn(4))
    fn = compile_graph_to_python(from_fx(gm))
    src = fn.__rewrite_source__
    assert "for " not in src and "if " not in src
    assert src.count("\n") <= 6  # def, two kernel calls, a del, return


def test_prune_keeps_side_effects_and_outputs():
    g = Graph("t")
    x = g.placeholder("x", TensorMeta(torch.float32, (sympy.Integer(3),)))
    dead = g.call(torch.ops.aten.exp.default, (x,), meta=x.meta)
    live = g.call(torch.ops.aten.neg.default, (x,), meta=x.meta)
    g.set_output((live,))
    assert g.prune() == 1
    assert dead not in g.nodes and live in g.nodes and x in g.nodes


torch.library.define("rewrite_test::mystery", "(Tensor x) -> Tensor")


@torch.library.impl("rewrite_test::mystery", "CompositeExplicitAutograd")
def _mystery(x):
    return torch.special.bessel_j0(x) * 2


@torch.library.register_fake("rewrite_test::mystery")
def _mystery_fake(x):
    return torch.empty_like(x)


def test_unknown_op_stays_opaque_and_runs_its_kernel():
    def fn(x):
        y = torch.ops.rewrite_test.mystery(x + 1)
        z = torch.ops.rewrite_test.mystery(x + 1)  # identical: may be CSE'd, must stay correct
        return y * z - 1

    x = torch.randn(16)
    backend = rewrite.get_backend()
    got = torch.compile(fn, backend=backend, fullgraph=True)(x)
    torch.testing.assert_close(got, fn(x))
    ops = backend.report.graphs[0].ops_after
    assert ops.get("rewrite_test.mystery.default", 0) >= 1


def test_compile_error_names_the_node_and_reason(monkeypatch):
    from rewrite.exec import codegen

    original = codegen._Emitter.call_expr

    def broken(self, node):
        if node.op == "aten.cos.default":
            raise ValueError("no kernel for this dtype")
        return original(self, node)

    monkeypatch.setattr(codegen._Emitter, "call_expr", broken)
    with pytest.raises(Exception) as info:
        torch.compile(lambda x: torch.cos(x) + 1, backend=rewrite.get_backend(), fullgraph=True)(torch.randn(3))
    message = str(info.value)
    assert "aten.cos.default" in message and "no kernel for this dtype" in message and "%cos" in message
    assert isinstance(info.value, CompileError) or isinstance(info.value.__cause__, CompileError) or \
        "CompileError" in message


@pytest.mark.parametrize("kind", ["txt", "pbtxt", "py"])
def test_graph_dump_writes_before_and_after(tmp_path, kind):
    config = rewrite.CompilerConfig()
    config.debug.graph_dump.type = kind
    config.debug.graph_dump.path = str(tmp_path)
    torch.compile(lambda x: torch.relu(x) * 2, backend=rewrite.get_backend(config))(torch.randn(4))
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 2, files
    assert all(f.endswith("." + kind) and f"pid_{os.getpid()}" in f and "rank_0" in f for f in files)
    assert any("before" in f for f in files) and any("after" in f for f in files)
    text = (tmp_path / files[0]).read_text()
    assert "relu" in text
    if kind == "py":
        compile(text, files[0], "exec")  # the py dump is valid Python


def test_explain_reports_counts_and_stages():
    def fn(x):
        return torch.relu(x).sum() + 0 * torch.ones(3).sum()

    report = rewrite.explain(fn, torch.randn(5))
    text = str(report)
    assert report.ops_before >= report.ops_after > 0
    assert "ops ->" in text and "time:" in text and "import" in text
    torch.testing.assert_close(report.result, fn(torch.randn(5)) * 0 + report.result)


def test_backend_by_name_and_entry_point():
    from importlib.metadata import entry_points

    names = [ep.name for ep in entry_points(group="torch_dynamo_backends")]
    assert "rewrite" in names
    x = torch.randn(4)
    torch.testing.assert_close(torch.compile(torch.sin, backend="rewrite")(x), torch.sin(x))


def test_graph_dump_writes_every_gear_graph(tmp_path):
    config = rewrite.CompilerConfig()
    config.debug.graph_dump.type = "txt"
    config.debug.graph_dump.path = str(tmp_path)
    x = torch.randn(2, 4)
    rewrite.inference.set_dim_gears(x, dim_gears={0: [1, 2, 4]})
    with torch.no_grad():
        torch.compile(torch.nn.Linear(4, 4), backend=rewrite.get_backend(config), fullgraph=True)(x)
    gear_files = sorted(f for f in os.listdir(tmp_path) if f.endswith("_gear.txt"))
    assert len(gear_files) == 3, os.listdir(tmp_path)
    for f, size in zip(gear_files, ("1", "2", "4")):
        assert f"f32[{size}, 4]" in (tmp_path / f).read_text()


def test_dynamic_int_argument_becomes_a_symbol_with_an_unbounded_range():
    def scale(x, n: int):
        return x * n + n

    compiled = torch.compile(scale, backend="rewrite", dynamic=True)
    x = torch.randn(5)
    for n in (2, 3, -7):
        torch.testing.assert_close(compiled(x, n), scale(x, n))


def test_cli_lists_rules_and_reports_a_bad_module(capsys):
    from rewrite.cli import main

    assert main(["rules"]) == 0
    listing = capsys.readouterr().out
    assert "shape.noops" in listing and "view_same_shape" in listing and "keeps dtype+shape" in listing
    assert main(["check-rules", "no_such_module_anywhere"]) == 2
    assert "cannot import module 'no_such_module_anywhere'" in capsys.readouterr().err


def _binding_samples():
    """One call per overload generated code may call through its Python binding (rewrite.ops.PYTHON_BINDINGS)."""
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 6, 6, generator=g)
    m = torch.randn(4, 5, generator=g)
    w = torch.randn(5, 3, generator=g)
    q = torch.randn(1, 2, 4, 8, generator=g)
    c = torch.rand(3, generator=g) + 0.5
    return {
        aten.convolution.default: (x, torch.randn(4, 3, 3, 3, generator=g), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
        aten.addmm.default: (torch.randn(3, generator=g), m, w),
        aten.mm.default: (m, w),
        aten.bmm.default: (q[0], q[0].transpose(1, 2)),
        aten.baddbmm.default: (q[0, :, :, :4], q[0], q[0].transpose(1, 2)[:, :, :4]),
        aten.permute.default: (x, [0, 2, 3, 1]),
        aten.t.default: (m,),
        aten.transpose.int: (x, 1, -1),
        aten.unsqueeze.default: (m, 1),
        aten.squeeze.dim: (m[:1], 0),
        aten.select.int: (x, 1, 2),
        aten.view.default: (m, [5, 4]),
        aten.expand.default: (c.view(3, 1), [3, 4]),
        aten.native_layer_norm.default: (m, [5], torch.ones(5), torch.zeros(5), 1e-5),
        aten._softmax.default: (m, -1, False),
        aten._log_softmax.default: (m, 0, False),
        aten.clone.default: (x.transpose(1, 2),),
        aten.cat.default: ([m, m], 1),
        aten.embedding.default: (w, torch.tensor([[0, 4], [2, 1]])),
        aten.constant_pad_nd.default: (x, [1, 2], 0.5),
        aten._native_batch_norm_legit_no_training.default: (x, c, c, c, c, 0.1, 1e-5),
        aten._scaled_dot_product_flash_attention_for_cpu.default: (q, q, q),
        aten.mean.dim: (x, [2, 3], True),
        aten.sum.dim_IntList: (x, [1]),
        aten.amax.default: (x, [0]),
        aten.relu.default: (m,), aten.tanh.default: (m,), aten.sigmoid.default: (m,), aten.exp.default: (m,),
        aten.rsqrt.default: (c,), aten.sqrt.default: (c,), aten.neg.default: (m,), aten.abs.default: (m,),
        aten.erf.default: (m,), aten.gelu.default: (m,), aten.silu.default: (m,),
        aten.hardtanh.default: (m, 0.0, 6.0),
        aten.max_pool2d_with_indices.default: (x, [2, 2], [2, 2]),
    }


def test_python_bindings_compute_what_their_overloads_compute():
    from rewrite.ops import PYTHON_BINDINGS, TENSOR_BINDINGS, kernel_of

    samples = _binding_samples()
    assert set(samples) == set(PYTHON_BINDINGS)  # every binding the executors use is checked here
    aten = torch.ops.aten
    kw = {aten.gelu.default: {"approximate": "tanh"}}
    for op, args in samples.items():
        fn = kernel_of(op)
        assert fn is PYTHON_BINDINGS[op] and fn.__name__ == op.overloadpacket.__name__, op
        got, want = fn(*args, **kw.get(op, {})), op._op(*args, **kw.get(op, {}))
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride(), op
            torch.testing.assert_close(g, w, rtol=0, atol=0, msg=str(op))
    a, b = torch.randn(3, 4), torch.randn(4)
    for op in TENSOR_BINDINGS:
        args = (a > 0, a, b) if op is aten.where.self else (a, b)
        assert kernel_of(op, all_tensors=True) is TENSOR_BINDINGS[op]
        torch.testing.assert_close(TENSOR_BINDINGS[op](*args), op._op(*args), rtol=0, atol=0)
        assert kernel_of(op) == op._op  # with a Python number among the operands the binding could mean .Scalar
    assert kernel_of(aten.index.Tensor) == aten.index.Tensor._op and kernel_of(len) is len
