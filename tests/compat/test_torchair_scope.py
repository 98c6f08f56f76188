"""TorchAir's stream-scope tests (tests/st/torchair_scope_st.py; the torchair.ops.wait/record tests of
torchair_st.py and torchair_aclgraph_st.py), ported. TorchAir inspects attributes and control inputs
of its GE graph; these inspect the optimized IR graph through `RewriteBackend.on_optimized`: a node's
``attrs["stream"]`` / ``["stream_priority"]`` / ``["stream_inner_parallel"]`` (TorchAir's
``_user_stream_label`` / ``_user_stream_priority`` / ``_enable_inner_parallel``) and ``node.waits``
(TorchAir's control edges). Results are compared with eager.
"""
from __future__ import annotations

import pytest
import torch

import rewrite
import rewrite.compat.torchair as torchair

aten = torch.ops.aten
NPU_ONLY = "NPU-only: the GE graph engine reads these scope attributes (super kernels, AI-core limits, op timeouts, data dump)"


class Capture(torchair.NpuBackend):
    """A get_npu_backend backend that keeps each optimized graph."""

    def __init__(self, config=None):
        super().__init__(config)
        self.graphs = []

    def on_optimized(self, graph, unit, frozen, gear_spec):
        self.graphs.append(graph)


def _run(model, *args, config=None, dynamic=False):
    backend = Capture(config)
    out = torch.compile(model, backend=backend, fullgraph=True, dynamic=dynamic)(*args)
    want = model(*args)
    for o, w in zip(out if isinstance(out, tuple) else (out,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(o, w)
    return backend.graphs[0]


def _ops(graph, target) -> list:
    return [n for n in graph.nodes if n.kind == "call" and n.target is target]


def _one(graph, target):
    found = _ops(graph, target)
    assert len(found) == 1, (target, graph)
    return found[0]


def _tags(node) -> tuple:
    return node.attrs.get("stream"), node.attrs.get("stream_priority"), node.attrs.get("stream_inner_parallel")


def _waits_on(node, *others) -> bool:
    return all(any(w is o for w in node.waits) for o in others)


def _inputs(*shape, n=4):
    return [torch.randn(*shape) for _ in range(n)]


def test_npu_stream_switch():
    """mirrors torchair_scope_st.py::test_npu_stream_switch"""
    class Model(torch.nn.Module):
        def forward(self, in1, in2, in3, in4):
            add_result = torch.add(in1, in2)
            with torchair.scope.npu_stream_switch('1', 3):
                torchair.scope.npu_wait_tensor(in4, add_result)
                mm_result = torch.mm(in3, in4)
            return add_result, mm_result

    graph = _run(Model(), *_inputs(2, 2))
    mm, add = _one(graph, aten.mm.default), _one(graph, aten.add.Tensor)
    assert _tags(mm)[:2] == ("1", 3)
    assert _waits_on(mm, add)


def test_npu_stream_switch_parallel():
    """mirrors torchair_scope_st.py::test_npu_stream_switch_parallel: the third argument
    (enable_inner_parallel, default True) is recorded on every op of its scope; ops outside carry
    no stream attributes."""
    class Model(torch.nn.Module):
        def forward(self, in1, in2, in3, in4):
            add_result = torch.add(in1, in2)
            with torchair.scope.npu_stream_switch('1', 2):
                torchair.scope.npu_wait_tensor(in4, add_result)
                mm_result = torch.mm(in3, in4)
            mm1_result = torch.mm(in3, in4 * 2)
            with torchair.scope.npu_stream_switch('2', 3, False):
                torchair.scope.npu_wait_tensor(in4, mm_result)
                add2 = torch.add(in3, in4)
            return add_result, mm_result, mm1_result, add2

    graph = _run(Model(), *_inputs(2, 2))
    adds, mms = _ops(graph, aten.add.Tensor), _ops(graph, aten.mm.default)
    first_add = next(n for n in adds if n.attrs.get("stream") is None)
    add2 = next(n for n in adds if n.attrs.get("stream") == "2")
    mm = next(n for n in mms if n.attrs.get("stream") == "1")
    mm1 = next(n for n in mms if n.attrs.get("stream") is None)
    assert _tags(first_add) == _tags(mm1) == (None, None, None)
    assert _tags(add2) == ("2", 3, False)
    assert _tags(mm) == ("1", 2, True)
    assert _waits_on(add2, mm) and _waits_on(mm, first_add)


def test_tranpose():
    """mirrors torchair_scope_st.py::test_tranpose (sic): a transpose inside a scope stays its own node
    on that stream although an equal transpose exists outside (CSE does not merge across streams)."""
    class Model(torch.nn.Module):
        def forward(self, in1, in2, in3):
            abs_01 = torch.abs(in1)
            t1 = torch.transpose(abs_01, 1, 2)
            with torchair.scope.npu_stream_switch("test", 1):
                bmm1 = torch.bmm(t1, in1)
                mm = torch.mm(torch.transpose(in2, 0, 1), torch.transpose(in3, 0, 1))
                t4 = torch.transpose(abs_01, 1, 2)
            bmm2 = torch.bmm(torch.transpose(abs_01, 1, 2), in1)
            return bmm1, mm, bmm2, t4

    graph = _run(Model(), torch.randn(8, 8, 4), torch.randn(8, 6), torch.randn(8, 8))
    tagged = {(n.attrs.get("stream"), n.attrs.get("stream_priority")) for n in _ops(graph, aten.permute.default)
              + _ops(graph, aten.transpose.int) if n.args[0].target is aten.abs.default}
    assert tagged == {(None, None), ("test", 1)}  # the outside transpose(s) untagged, t4 on "test"


def test_nested_scope():
    """mirrors torchair_scope_st.py::test_nested_scope, stream half: a stream scope inside a
    super_kernel scope applies (super_kernel is an NPU-only no-op here)."""
    class Model(torch.nn.Module):
        def forward(self, in1, in2, in3, in4):
            with torchair.scope.super_kernel('1', '2'):
                mm_result = torch.mm(in3, in4)
                with torchair.scope.npu_stream_switch('5', 6):
                    add_result = torch.add(in1, in2)
            return add_result, mm_result

    graph = _run(Model(), *_inputs(2, 2))
    assert _tags(_one(graph, aten.add.Tensor))[:2] == ("5", 6)
    assert _tags(_one(graph, aten.mm.default))[:2] == (None, None)


@pytest.mark.skip(reason=NPU_ONLY)
def test_super_kernel_scope():
    """mirrors torchair_scope_st.py::test_super_kernel_scope (and _none)"""


@pytest.mark.skip(reason=NPU_ONLY)
def test_super_core_num():
    """mirrors torchair_scope_st.py::test_super_core_num and test_nested_core_num"""


@pytest.mark.skip(reason=NPU_ONLY)
def test_never_timeout_scope():
    """mirrors torchair_scope_st.py::test_never_timeout_scope"""


@pytest.mark.skip(reason=NPU_ONLY)
def test_ge_data_dump():
    """mirrors torchair_scope_st.py::test_ge_data_dump"""


def test_never_timeout_scope_invalid_arg():
    """mirrors torchair_scope_st.py::test_never_timeout_scope_invalid_arg: the argument is checked as
    TorchAir checks it (the scope itself does nothing off the NPU)."""
    with pytest.raises(TypeError, match="op_never_timeout\\(\\) argument 'enable' must be bool"):
        torchair.scope.op_never_timeout(enable=1)


def test_ge_wait_pass():
    """mirrors torchair_st.py::test_ge_wait_pass: ops.wait([t]) makes the next op on the current
    stream wait for t's producer."""
    def fn(x, y):
        add = x + y
        mm = torch.mm(add, x)
        with torchair.scope.npu_stream_switch('1'):
            torchair.ops.wait([add])
            add1 = x + y
        return mm, add1

    graph = _run(fn, torch.ones(4, 4), torch.ones(4, 4))
    adds = _ops(graph, aten.add.Tensor)
    add = next(n for n in adds if n.attrs.get("stream") is None)
    add1 = next(n for n in adds if n.attrs.get("stream") == "1")
    assert _waits_on(add1, add)


def test_ge_wait_and_record_pass():
    """mirrors torchair_st.py::test_ge_wait_and_record_pass: record() stands for the last op issued
    on the current stream (the mm); eager record() is an empty tensor and wait() returns None."""
    def fn(x, y):
        add = x + y
        mm = torch.mm(add, x)
        rec = torchair.ops.record()
        with torchair.scope.npu_stream_switch('1'):
            torchair.ops.wait([rec])
            add1 = x + y
        return mm, add1

    graph = _run(fn, torch.ones(4, 4), torch.ones(4, 4))
    add1 = next(n for n in _ops(graph, aten.add.Tensor) if n.attrs.get("stream") == "1")
    assert _waits_on(add1, _one(graph, aten.mm.default))
    assert torchair.ops.record().numel() == 0 and torchair.ops.wait([torch.ones(1)]) is None


def test_ge_wait_and_record_pass_muti_pass():
    """mirrors torchair_st.py::test_ge_wait_and_record_pass_muti_pass: a wait issued at the end of one
    stream-'2' block is carried to the next op issued on stream '2' in a later block; the default
    stream is unaffected."""
    def fn(x, y):
        with torchair.scope.npu_stream_switch('1'):
            add = x + y
            rec = torchair.ops.record()
            mm1 = torch.mm(x, y)
            mul = x * add
        with torchair.scope.npu_stream_switch('2'):
            add2 = x + mul
            torchair.ops.wait([rec, mul])
        add3 = x + mul * 3
        with torchair.scope.npu_stream_switch('2'):
            mm2 = torch.mm(x, add2)
        return add3, mm2, mm1

    graph = _run(fn, torch.ones(4, 4), torch.ones(4, 4))
    mm2 = next(n for n in _ops(graph, aten.mm.default) if n.attrs.get("stream") == "2")
    add = next(n for n in _ops(graph, aten.add.Tensor) if n.attrs.get("stream") == "1")
    mul = next(n for n in _ops(graph, aten.mul.Tensor) if n.attrs.get("stream") == "1")
    assert _waits_on(mm2, add, mul)
    default_stream = [n for n in graph.nodes if n.kind == "call" and n.attrs.get("stream") is None]
    assert not any(_waits_on(n, add) for n in default_stream)


def _wait_chain(kind):
    def with_wait(x):
        mm = torch.mm(x, x)
        with torchair.scope.npu_stream_switch('1', 3):
            torchair.ops.wait([mm])
            abs1 = torch.abs(mm)
            add1 = torch.add(abs1, 1)
        with torchair.scope.npu_stream_switch('2', 3):
            torchair.ops.wait([mm, abs1])
            sub = torch.sub(add1, mm)
        return sub

    def with_record(x):
        mm = torch.mm(x, x)
        result1 = torchair.ops.record()
        with torchair.scope.npu_stream_switch('1', 3):
            torchair.ops.wait([result1])
            abs1 = torch.abs(mm)
            result2 = torchair.ops.record()
        with torchair.scope.npu_stream_switch('2', 3):
            torchair.ops.wait([result2])
            add1 = torch.add(abs1, 1)
            result3 = torchair.ops.record()
        with torchair.scope.npu_stream_switch('3', 3):
            torchair.ops.wait([result2, result3])
            sub = torch.sub(abs1, add1)
        return sub

    def with_record_wait(x):
        mm = torch.mm(x, x)
        result1 = torchair.ops.record()
        with torchair.scope.npu_stream_switch('1', 3):
            torchair.ops.wait([result1])
            abs1 = torch.abs(mm)
        with torchair.scope.npu_stream_switch('2', 3):
            torchair.ops.wait([abs1])
            add1 = torch.add(abs1, 1)
            result3 = torchair.ops.record()
        with torchair.scope.npu_stream_switch('3', 3):
            torchair.ops.wait([abs1, result3])
            sub = torch.sub(abs1, add1)
        return sub

    return {"wait": with_wait, "record": with_record, "record_wait": with_record_wait}[kind]


@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead"])
@pytest.mark.parametrize("kind", ["wait", "record", "record_wait"])
def test_npu_stream_record_wait(kind, mode):
    """mirrors torchair_aclgraph_st.py::test_npu_stream_record_wait_with_wait / _with_record /
    _with_record_wait (TorchAir runs them in reduce-overhead mode; here in both modes): each op
    waits for what its stream was told to wait for."""
    config = torchair.CompilerConfig()
    config.mode = mode
    graph = _run(_wait_chain(kind), torch.randn(3, 3), config=config)
    mm, abs1 = _one(graph, aten.mm.default), _one(graph, aten.abs.default)
    sub = _one(graph, aten.sub.Tensor)
    assert _waits_on(abs1, mm)
    if kind == "wait":
        assert _waits_on(sub, mm, abs1)
    else:
        add1 = _one(graph, aten.add.Tensor)
        assert _waits_on(add1, abs1) and _waits_on(sub, abs1, add1)


def test_ops_wait_rejects_empty_and_non_tensors():
    """TorchAir's torchair.ops.wait checks (ops/_record_wait.py)."""
    with pytest.raises(ValueError, match="requires at least one tensor input"):
        torchair.ops.wait([])
    with pytest.raises(ValueError, match="must be torch.Tensor"):
        torchair.ops.wait([1])


def test_npu_stream_switch_with_stream_closure():
    """mirrors torchair_aclgraph_st.py::test_npu_stream_switch_with_stream_closure: nested scopes;
    every side stream has finished when the graph returns (results equal eager)."""
    class Model(torch.nn.Module):
        def forward(self, in1, in2, in3, in4):
            add_result = torch.add(in1, in2)
            with torchair.scope.npu_stream_switch('1', 3):
                mm_result1 = torch.mm(in3, in4)
                with torchair.scope.npu_stream_switch('2', 3):
                    mm_result2 = torch.mm(in3, in4 + 1)
            return add_result, mm_result1, mm_result2

    for mode in ("max-autotune", "reduce-overhead"):
        config = torchair.CompilerConfig()
        config.mode = mode
        graph = _run(Model(), *_inputs(8, 8), config=config)
        assert {n.attrs.get("stream") for n in _ops(graph, aten.mm.default)} == {"1", "2"}


def _insert_before_mm(marker, args):
    def custom_pass(gm, example_inputs, config):
        for node in list(gm.graph.nodes):
            if node.op == "call_function" and node.target == aten.mm.default:
                with gm.graph.inserting_before(node):
                    gm.graph.call_function(marker, args=args)
    return custom_pass


def _cus_func(x, y):
    return torch.abs(torch.mm(torch.add(x, y), x))


def test_miss_scope_exit():
    """mirrors torchair_st.py::test_miss_scope_exit: a post_grad_custom_pre_pass that opens a stream
    scope without closing it fails the compile (a RuntimeError naming the scope)."""
    config = torchair.CompilerConfig()
    config.post_grad_custom_pre_pass = _insert_before_mm(torch.ops.rewrite_stream.scope_enter.default, ("stream_1", 0))
    compiled = torch.compile(_cus_func, backend=torchair.get_npu_backend(compiler_config=config), fullgraph=True)
    with pytest.raises(RuntimeError, match="'stream_1' is opened but never closed"):
        compiled(torch.ones(4, 4), torch.ones(4, 4))


def test_miss_scope_enter():
    """mirrors torchair_st.py::test_miss_scope_enter: closing a scope that was never opened fails."""
    config = torchair.CompilerConfig()
    config.post_grad_custom_pre_pass = _insert_before_mm(torch.ops.rewrite_stream.scope_exit.default, ())
    compiled = torch.compile(_cus_func, backend=torchair.get_npu_backend(compiler_config=config), fullgraph=True)
    with pytest.raises(RuntimeError, match="closes a stream scope that was never opened"):
        compiled(torch.ones(4, 4), torch.ones(4, 4))


def test_stream_tags_survive_the_post_pass():
    """rewrite's hook path keeps stream tags and waits through post_grad_custom_post_pass (the
    optimized graph goes to FX and back)."""
    class Model(torch.nn.Module):
        def forward(self, in1, in2, in3, in4):
            add_result = torch.add(in1, in2)
            with torchair.scope.npu_stream_switch('1', 3):
                torchair.scope.npu_wait_tensor(in4, add_result)
                mm_result = torch.mm(in3, in4)
            return add_result, mm_result

    config = rewrite.CompilerConfig()
    config.post_grad_custom_post_pass = lambda gm: None
    graph = _run(Model(), *_inputs(2, 2), config=config)
    mm = _one(graph, aten.mm.default)
    assert _tags(mm) == ("1", 3, True) and _waits_on(mm, _one(graph, aten.add.Tensor))
