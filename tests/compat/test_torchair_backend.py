"""TorchAir's backend tests (tests/st/torchair_st.py, the npugraph_ex tests), ported: what a script
that builds its backend with `torchair.get_npu_backend` relies on. TorchAir asserts on its GE graph;
these assert the same facts on rewrite's report (`ops_after`), on the optimized IR graph (through
`RewriteBackend.on_optimized`) and on results compared with eager.
"""
from __future__ import annotations

import pytest
import torch

import rewrite
import rewrite.compat.torchair as torchair
from rewrite.ir import SymMeta

_lib = torch.library.Library("rewrite_compat_test", "DEF")
_lib.define("add(Tensor input) -> Tensor")
_lib.impl("add", lambda t: t.clone(), "CPU")
_lib.impl("add", lambda t: t.new_empty(t.size()), "Meta")


def test_decomp():
    """mirrors torchair_cache_compile_st.py::test_decomp (custom_decompositions of get_npu_backend):
    the user's decomposition replaces the custom op while AOTAutograd traces."""
    op = torch.ops.rewrite_compat_test.add.default
    backend = torchair.get_npu_backend(custom_decompositions={op: lambda t: t * 3})
    compiled = torch.compile(lambda t: torch.ops.rewrite_compat_test.add(t), backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(torch.ones(2)), torch.full((2,), 3.0))
    assert "rewrite_compat_test.add.default" not in backend.report.graphs[0].ops_before


def test_custom_decompositions_must_be_a_dict():
    """TorchAir's get_npu_backend takes a dict {OpOverload: fn}; anything else is a clear TypeError."""
    with pytest.raises(TypeError, match="decompositions must be a dict"):
        torchair.get_npu_backend(custom_decompositions=[torch.ops.aten.add.Tensor])


def test_get_npu_backend_accepts_options():
    """mirrors npu_fx_compiler._npu_backend(..., **kwargs): torch.compile(..., options=) reaches a
    get_npu_backend backend and is read with npugraph_ex's option names."""
    backend = torchair.get_npu_backend(compiler_config=torchair.CompilerConfig())
    model = torch.nn.Linear(4, 4).eval()
    compiled = torch.compile(model, backend=backend, options={"frozen_parameter": False}, fullgraph=True)
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        model.weight.add_(1)  # not frozen in this compile: the next call sees the change without compiling again
        torch.testing.assert_close(compiled(x), model(x))
    assert rewrite.stats(compiled).refreezes == 0
    assert backend.config.experimental_config.frozen_parameter is True  # options apply to that compile only


def test_get_npu_backend_rejects_unknown_option():
    """mirrors npugraphex_config._process_kwargs_options: an unknown option names the allowed ones."""
    backend = torchair.get_npu_backend()
    compiled = torch.compile(lambda x: x + 1, backend=backend, options={"no_such_option": 1})
    with pytest.raises(Exception, match="Invalid option 'no_such_option', allowed options"):
        compiled(torch.ones(2))


def test_npugraph_ex_process_kwargs_options_invalid_option():
    """mirrors npugraph_ex test_npugraph_ex_process_kwargs_options_invalid_option: a bad value
    names the allowed values."""
    compiled = torch.compile(lambda x: x + 1, backend="npugraph_ex", options={"inplace_pass": "test"})
    with pytest.raises(Exception, match=r"Value 'test' .* not in optional list \[True, False\]"):
        compiled(torch.ones(2))


def test_npugraph_ex_backend_name():
    """mirrors npugraph_ex_compile test_aclgraph_capture_and_replay: backend="npugraph_ex" works once
    the shim is imported, with npugraph_ex's options."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()).eval()
    compiled = torch.compile(model, backend="npugraph_ex", options={"clone_input": False}, dynamic=False)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(3, 4)
            torch.testing.assert_close(compiled(x), model(x))


class _Capture(torchair.NpuBackend):
    """A get_npu_backend backend that keeps each optimized graph (the on_optimized hook)."""

    def __init__(self, config=None):
        super().__init__(config)
        self.graphs = []

    def on_optimized(self, graph, unit, frozen, gear_spec):
        self.graphs.append(graph)


def _read_inputs(graph) -> list:
    read = {i.id for n in graph.nodes for i in n.inputs}
    return [p for p in graph.placeholders if p.id in read]


def test_same_sym_pack_merge():
    """mirrors torchair_st.py::test_same_sym_pack_merge (TorchAir: 8 Data before, 6 after its
    optimization). Dynamo's graph takes 8 inputs: the model's 6 arguments and the two sizes of p it
    lifted. Issue 51: those two are read from p's dims, so the optimized graph takes the 6 arguments,
    as TorchAir's does (the compiled function picks them out of Dynamo's call). Regression (issue 15):
    the int y, equal to a dim of p, is read from that dim, so the graph reads 5 of them."""
    class Model(torch.nn.Module):
        def forward(self, x, y, z, p, m, n):
            b = p.view([x]) + z.view([x]) + z.view([x])
            c = m.view([x, x]).sum()
            a = torch.stack([n, n, n, n])
            d = (m.view([4, y, y]) + a).sum()
            return b + c - d

    backend = _Capture()
    compiled = torch.compile(Model(), backend=backend, dynamic=True)
    for args in [(6, 3, torch.randn(3, 2), torch.randn(2, 3), torch.randn(36), torch.randn(3, 3)),
                 (8, 4, torch.randn(4, 2), torch.randn(2, 4), torch.randn(64), torch.randn(4, 4))]:
        torch.testing.assert_close(compiled(*args), Model()(*args))
    graph = backend.graphs[0]
    assert len(graph.placeholders) == 6
    assert sum(isinstance(p.meta, SymMeta) for p in graph.placeholders) == 2  # x and y; p's sizes are gone
    assert len(_read_inputs(graph)) == 5
    assert backend.report.graphs[0].applied.get("sizes_read_from_tensors") == 1


_MOVES_ONES = [((2, 3, 1), [2, 0, 1]), ((1, 2, 3, 1), [1, 3, 2, 0]), ((1, 2, 2, 1), [1, 0, 3, 2]),
               ((1, 2, 2, 1), [1, 0, -1, -2])]
_REAL_PERMUTES = [((2, 3, 1), [1, 2, 0]), ((1, 2, 3, 1), [2, 3, 1, 0]), ((1, 2, 2, 1), [0, 2, 1, 3]),
                  ((1, 2, 2, 1), [0, -2, 1, -1])]


def _compiled_ops(fn, *args, dynamic):
    backend = torchair.get_npu_backend()
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    torch.testing.assert_close(compiled(*args), fn(*args))
    return backend.report.graphs[0].ops_after


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("shape,dims", _MOVES_ONES)
def test_permute_with_no_transpose(shape, dims, dynamic):
    """mirrors torchair_st.py::test_permute_with_no_transpose. Regression (issue 15): a permute that
    only moves size-1 dims is a reshape (rule shape.permutes permute_*_moves_ones_*)."""
    ops = _compiled_ops(lambda t: torch.permute(t, dims) + 1, torch.randn(shape), dynamic=dynamic)
    assert "aten.permute.default" not in ops


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("shape,dims", _REAL_PERMUTES)
def test_permute_with_transpose(shape, dims, dynamic):
    """mirrors torchair_st.py::test_permute_with_transpose: a permute that moves a dim of size > 1
    (even swapping two equal sizes) stays."""
    ops = _compiled_ops(lambda t: torch.permute(t, dims) + 1, torch.randn(shape), dynamic=dynamic)
    assert ops.get("aten.permute.default") == 1


@pytest.mark.parametrize("dynamic", [False, True])
def test_squeeze_opt_for_dim_not_one(dynamic):
    """mirrors torchair_st.py::test_squeeze_opt_for_dim_not_one (TorchAir: 3 Squeeze + 2 Identity).
    Regression (issue 15): squeezes of dims that are not 1 are removed (rule squeeze_dims_not_one)."""
    def fn(x, l, m, n):
        return x.squeeze(1) + 1, x.squeeze(2) + 1, l.squeeze() + 1, m.squeeze() + 1, n.squeeze() + 1

    ops = _compiled_ops(fn, torch.randn(2, 1, 3), torch.randn(2, 3, 4), torch.randn(2, 1, 1), torch.randn(1, 1, 1),
                        dynamic=dynamic)
    squeezes = sum(v for k, v in ops.items() if "squeeze" in k)
    assert squeezes == 3, ops


@pytest.mark.parametrize("dynamic", [False, True])
def test_no_broadcast_when_input_output_sym_size_is_equal(dynamic):
    """mirrors torchair_st.py::test_no_broadcast_when_input_output_sym_size_is_equal: an expand to the
    same size and a full slice are removed."""
    fn = lambda t: t + torch.ops.aten.expand.default(t, t.size()) + torch.ops.aten.slice.Tensor(t)  # noqa: E731
    for i in (10, 11):
        ops = _compiled_ops(fn, torch.randn(i, i + 1, i + 2, i + 3), dynamic=dynamic)
        assert not any("expand" in k or "slice" in k for k in ops), ops
        torch._dynamo.reset()


# -- results and types (torchair_st.py): compiled == eager ------------------------------------------

def _same(fn, *args, dynamic=True):
    compiled = torch.compile(fn, backend=torchair.get_npu_backend(), dynamic=dynamic)
    got, want = compiled(*args), fn(*args)
    torch.testing.assert_close(got, want)
    return got


def test_basic():
    """mirrors torchair_st.py::test_basic"""
    for _ in range(2):
        _same(lambda x, y: x + y, torch.randn(2, 2, 2), torch.randn(2, 2, 2))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128, torch.bfloat16])
def test_multiple_input_types(dtype):
    """mirrors torchair_st.py::test_multiple_input_types (complex32 has no CPU add)"""
    x = torch.randn(2, 2, 2).to(dtype) if not dtype.is_complex else torch.randn(2, dtype=dtype)
    assert _same(lambda t: t + t, x).dtype == dtype


@pytest.mark.parametrize("y", [2, 3, 2.0, 3.0])
def test_sym_input(y):
    """mirrors torchair_st.py::test_sym_input"""
    _same(lambda x, v: x + v, torch.randn(2, 2), y)


def test_builtin_with_sym():
    """mirrors torchair_st.py::test_builtin_with_sym"""
    def fn(x, y, z):
        return x + (y + z), x * (y - z), x - y * z, x + y / z, x + y // z, x * y ** z

    for y, z in [(2, 3), (3, 4)]:
        _same(fn, torch.randn(2, 2), y, z)


def test_different_fx_output_from_same_fx_node():
    """mirrors torchair_st.py::test_different_fx_output_from_same_fx_node: one value returned twice is
    one object twice."""
    x = torch.randn(2, 2)
    for fn, pairs in [(lambda t: (t, t), [(0, 1)]), (lambda t: (t, t + 1, t), [(0, 2)]),
                      (lambda t: (t + 1, t, t), [(1, 2)]), (lambda t: (t, t, t + 1), [(0, 1)])]:
        torch._dynamo.reset()
        out = torch.compile(fn, backend=torchair.get_npu_backend())(x)
        assert all(out[i] is out[j] for i, j in pairs)


def test_torch_sym():
    """mirrors torchair_st.py::test_torch_sym"""
    import math

    fn = lambda x: x * (float(x.size(-1)) + 1 / math.sqrt(x.size(-1)))  # noqa: E731
    for i in (10, 11, 12):
        _same(fn, torch.randn(3, i, i + 1))


def test_remove_sym():
    """mirrors torchair_st.py::test_remove_sym"""
    def fn(x, y, z):
        return torch.cat([torch.ones(x.size()), torch.ones(y.size())]), torch.ones(x.size()), torch.split(x, z)

    for n in (2, 3, 4):
        _same(fn, torch.randn(2 * n, 2), torch.randn(n, 2), [n, n])


def test_torch_floor():
    """mirrors torchair_st.py::test_torch_floor"""
    import math

    compiled = torch.compile(lambda x: math.floor(x.size(0) + 1.0) * 3, backend=torchair.get_npu_backend(),
                             fullgraph=True)
    assert compiled(torch.randn(10, 2)) == 33


def test_recompile_of_symsize():
    """mirrors torchair_st.py::test_recompile_of_symsize (smaller sizes): a second sequence length
    does not recompile."""
    def fn(x, y):
        return torch.mm(x.reshape(-1, 64), y.permute(1, 0)).view(x.size(0), x.size(1), 24)

    compiled = torch.compile(fn, backend=torchair.get_npu_backend(), dynamic=True)
    y = torch.randn(24, 64)
    compiled(torch.randn(4, 19, 64), y)
    with torch._dynamo.config.patch(error_on_recompile=True):
        x = torch.randn(4, 18, 64)
        torch.testing.assert_close(compiled(x, y), fn(x, y))


def test_torch_fp8():
    """mirrors torchair_st.py::test_torch_fp8"""
    def fn(x, y, z):
        return x.to(torch.float8_e4m3fn), y.to(torch.float).to(torch.float8_e5m2), z.to(torch.float)

    x, y = torch.randn(2, 2), torch.randn(2, 2).to(torch.float8_e5m2)
    z = torch.randn(2, 2).to(torch.float8_e4m3fn)
    out = torch.compile(fn, backend=torchair.get_npu_backend())(x, y, z)
    assert [t.dtype for t in out] == [torch.float8_e4m3fn, torch.float8_e5m2, torch.float32]
    for got, want in zip(out, fn(x, y, z)):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_sym_sum():
    """mirrors torchair_st.py::test_sym_sum"""
    def fn(sizes, masks):
        return [m.sum() + sum(sizes[:i]) for i, m in enumerate(masks)]

    compiled = torch.compile(fn, backend=torchair.get_npu_backend(), dynamic=True)
    sizes, masks = [3, 4, 5, 6, 7], [torch.rand(n) > 0.5 for n in (3, 4, 5, 6, 7)]
    assert [int(t) for t in compiled(sizes, masks)] == [int(t) for t in fn(sizes, masks)]


def test_uncontinuous_view():
    """mirrors torchair_st.py::test_uncontinuous_view"""
    _same(lambda x: (x.permute(1, 0, 2) + 1).permute(1, 0, 2).reshape(-1), torch.randn(2, 3, 4))


@pytest.mark.parametrize("direction", ["real", "complex"])
def test_view_as_real_complex_dynamic_sym(direction):
    """mirrors torchair_st.py::test_view_as_real_dynamic_sym / test_view_as_complex_dynamic_sym: the
    output is a view of the input, as in eager."""
    fn = torch.view_as_real if direction == "real" else torch.view_as_complex
    x = torch.randn(4, 3, dtype=torch.complex64) if direction == "real" else torch.randn(4, 3, 2)
    res = torch.compile(fn, backend=torchair.get_npu_backend(), dynamic=True)(x)
    assert torch._C._is_alias_of(res, x)
    torch.testing.assert_close(res, fn(x))


def test_sym_pack():
    """mirrors torchair_st.py::test_sym_pack"""
    _same(lambda x, z, y: z.view([x]) + y.view([x, 1]).sum() + x, 6, torch.randn(3, 2), torch.randn(2, 3))


def test_frozen_parameter_option():
    """the frozen_parameter option (TorchAir: fixed addresses; rewrite: the weights' values are
    folded in, so the compiled graph does not see later in-place updates of them; see docs/porting_from_torchair.md)."""
    model = torch.nn.Linear(4, 4).eval()
    compiled = torch.compile(model, backend="npugraph_ex", options={"frozen_parameter": True})
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.skip(reason="NPU-only: GE executors, converters, RNG seed/offset inputs and aclgraph capture internals")
def test_npu_executor():
    """mirrors torchair_st.py::test_npu_executor_*, test_*_executor_*, test_frozen_input_*,
    test_rng_into_graph, test_ge_*, test_auto_converter, test_output_always_with_correct_dtype,
    test_custom_tensor_clone and torchair_aclgraph_st.py's capture tests"""


# -- no-op removal (torchair_fx_pattern_st.py, Inductor's remove_noop_ops) ------------------------------

_NOOPS = {
    "slice": (lambda x, y: x[:] + y, "slice"),
    "slice_scatter": (lambda x, y: x.slice_scatter(y) + 1, "slice_scatter"),
    "repeat": (lambda x, y: x.repeat(1, 1) + y, "repeat"),
    "pad": (lambda x, y: torch.nn.functional.pad(x, [0, 0, 0, 0], value=3.5) + y, "constant_pad_nd"),
    "convert": (lambda x, y: torch.ops.prims.convert_element_type(x, torch.float32) + y, "convert_element_type"),
    "ceil_int": (lambda x, y: torch.ceil(x.to(torch.int64)) + 1, "ceil"),
    "pow1": (lambda x, y: torch.pow(x, 1) + y, "pow"),
    "cat1": (lambda x, y: torch.cat([x]) + y, "cat"),
}


@pytest.mark.parametrize("name", sorted(_NOOPS))
def test_enable_remove_noop_ops(name):
    """mirrors torchair_fx_pattern_st.py::test_enable_remove_noop_ops_slice, _slice_scatter, _repeat,
    _pad, _convert, _ceil, _pow, _cat: the no-op is gone from the compiled graph. Regression
    (issue 15): full slice_scatter, repeat of ones, zero pad, same-dtype convert and integer ceil stayed."""
    fn, op = _NOOPS[name]
    ops = _compiled_ops(fn, torch.randn(2, 2), torch.randn(2, 2), dynamic=True)
    assert not any(op in k for k in ops), ops


def test_disable_remove_noop_ops():
    """mirrors torchair_fx_pattern_st.py::test_disable_remove_noop_ops: with the optimizer's rules off
    (rewrite's switch: config.rules.disabled; the npugraph_ex option remove_noop_ops is accepted and
    has no effect) the slice stays."""
    config = torchair.CompilerConfig()
    config.rules.disabled = ["shape.noops"]
    backend = torchair.get_npu_backend(compiler_config=config)
    fn = lambda x, y: x[:] + y  # noqa: E731
    x, y = torch.randn(2, 2), torch.randn(2, 2)
    torch.testing.assert_close(torch.compile(fn, backend=backend, dynamic=True)(x, y), fn(x, y))
    assert any("slice" in k for k in backend.report.graphs[0].ops_after)


def test_enable_remove_noop_ops_clone_skipped():
    """mirrors torchair_fx_pattern_st.py::test_enable_remove_noop_ops_clone_skipped: a clone that is
    the output stays (the caller must not get its input back). (test_enable_remove_noop_ops_clone and
    _clone_inplace are not ported: rewrite keeps a clone of an input on purpose, see docs/porting_from_torchair.md.)"""
    ops = _compiled_ops(lambda x: x.clone(), torch.randn(2, 2), dynamic=True)
    assert ops.get("aten.clone.default") == 1
