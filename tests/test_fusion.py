"""Pointwise fusion of static-kernel steps (`rewrite.kernels.fusion`, `cgen.gen_fused`).

Each graph here is planned twice with static kernels, with fusion and without, and run against its
plain ATen code: a fused group must give the bits its steps give one by one, and the plan must
actually fuse (or, where a value is needed outside the group, must not).
"""
from __future__ import annotations

import operator

import pytest
import torch

import rewrite
from rewrite.exec.codegen import compile_graph_to_python
from rewrite.exec.memory import ArenaPool
from rewrite.exec.observe import observe
from rewrite.exec.plan import make_plan
from rewrite.exec.planned import PlannedExecutable
from rewrite.ir import Graph, meta_of_value
from rewrite.kernels import StaticKernels, cgen, compiler, signature
from rewrite.unit import CompileUnit

aten = torch.ops.aten
CL = torch.channels_last

pytestmark = pytest.mark.skipif(not compiler.compiler_available(), reason="no C compiler")


class Builder:
    """A small IR graph built op by op, each node's meta taken from running the op eagerly."""

    def __init__(self):
        self.g = Graph("fusion")
        self.inputs: list = []
        self.values: dict = {}

    def input(self, t: torch.Tensor):
        node = self.g.placeholder(f"in{len(self.inputs)}", meta_of_value(t))
        self.inputs.append(t)
        self.values[node.id] = t
        return node

    def call(self, op, *args, **kwargs):
        real = lambda a: self.values[a.id] if hasattr(a, "id") else a  # noqa: E731
        value = op(*[real(a) for a in args], **{k: real(v) for k, v in kwargs.items()})
        node = self.g.call(op, args, kwargs, meta=meta_of_value(value))
        self.values[node.id] = value
        return node

    def getitem(self, node, k: int):
        value = self.values[node.id][k]
        out = self.g.call(operator.getitem, (node, k), {}, meta=meta_of_value(value))
        self.values[out.id] = value
        return out


def _planned(b: Builder, tmp_path, fuse: bool):
    tmp_path.mkdir(exist_ok=True)
    config = rewrite.CompilerConfig()
    kernels = StaticKernels(config, CompileUnit.detached("fusion", config), str(tmp_path))
    obs = observe(b.g, b.inputs)
    plan = make_plan(b.g, obs, "cpu", native=kernels.decide, fuse=kernels.fuse if fuse else None)
    kernels.build()
    return plan, PlannedExecutable(b.g, plan, ArenaPool("cpu"), kernels, compile_graph_to_python(b.g))


def _same_bits(got, want, label):
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride(), label
    same = torch.equal(got, want) or (want.is_floating_point() and torch.equal(got.isnan(), want.isnan())
                                      and torch.equal(got.nan_to_num(), want.nan_to_num()))
    assert same, (label, (got.double() - want.double()).abs().max().item())


def _check(b: Builder, tmp_path, exact: bool = True) -> dict:
    """Run the graph fused, with one kernel per step, and as ATen code: fused must equal one kernel per
    step bit for bit (and both ATen, to its rounding: ATen's batch norm may contract into an FMA).
    ``exact=False``: graphs with transcendental functions, whose vector (libmvec) and scalar (libm)
    versions differ in the last bits, and a loop's shape decides which one an element gets.
    Returns the fused plan's kind counts."""
    plain = compile_graph_to_python(b.g)
    fused_plan, fused = _planned(b, tmp_path / "fused", True)
    _, apart = _planned(b, tmp_path / "apart", False)
    with torch.no_grad():
        want = plain(*b.inputs)
        for call in range(2):  # the second call reuses the arena
            one_by_one, together = apart(*b.inputs), fused(*b.inputs)
            for w, r, f in zip(want, one_by_one, together):
                if exact:
                    _same_bits(f, r, f"fused against one kernel per step, call {call}")
                else:
                    torch.testing.assert_close(f, r, rtol=1e-6, atol=1e-7, equal_nan=True)
                torch.testing.assert_close(r, w, rtol=1e-6, atol=1e-6, equal_nan=True)
    return fused_plan.counts()


def _batch_norm(b: Builder, x, channels: int):
    stats = [b.input(torch.randn(channels)), b.input(torch.randn(channels)), b.input(torch.randn(channels)),
             b.input(torch.rand(channels) + 0.5)]
    bn = b.call(aten._native_batch_norm_legit_no_training.default, x, *stats, 0.1, 1e-5)
    return b.getitem(bn, 0)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_a_residual_block_tail_runs_as_one_kernel(tmp_path, layout):
    # ResNet's batch_norm -> add -> relu, the shortcut through its own batch norm: 4 steps, one kernel
    b = Builder()
    make = lambda: torch.randn(2, 8, 5, 5).contiguous(memory_format=CL if layout == "channels_last" else torch.contiguous_format)  # noqa: E731
    x, shortcut = b.input(make()), b.input(make())
    y = b.call(aten.add.Tensor, _batch_norm(b, x, 8), _batch_norm(b, shortcut, 8))
    out = b.call(aten.relu.default, y)
    b.g.set_output((out,))
    counts = _check(b, tmp_path)
    assert counts["native"] == 1 and counts["fused"] == 5  # two batch norms, their getitems, the add


def test_shared_values_broadcasts_masks_and_dtypes_fuse_exactly(tmp_path):
    b = Builder()
    x = b.input(torch.randn(4, 6) * 3)
    bias = b.input(torch.randn(6))
    mask = b.input(torch.rand(4, 1) > 0.5)
    a = b.call(aten.add.Tensor, x, bias)  # a [6] bias broadcast over rows
    s = b.call(aten.clamp.default, a, -1.0, 2.0)
    both = b.call(aten.mul.Tensor, a, s)  # a read twice in the group
    wide = b.call(aten._to_copy.default, both, dtype=torch.float64)  # a float64 step between float32 ones
    scaled = b.call(aten.mul.Tensor, wide, 0.1)
    narrow = b.call(aten._to_copy.default, scaled, dtype=torch.float32)
    gt = b.call(aten.gt.Scalar, narrow, 0.0)  # a bool step feeding a select
    picked = b.call(aten.where.self, gt, narrow, x)
    out = b.call(aten.masked_fill.Scalar, picked, mask, -1.5)
    b.g.set_output((out,))
    counts = _check(b, tmp_path)
    assert counts["native"] == 1 and counts["fused"] == 8


def test_a_value_needed_outside_stays_in_memory(tmp_path):
    b = Builder()
    x = b.input(torch.randn(3, 7))
    a = b.call(aten.exp.default, x)
    c = b.call(aten.neg.default, a)
    d = b.call(aten.mul.Tensor, c, 2.0)
    e = b.call(aten.sum.dim_IntList, a, [1])  # a's other reader is no pointwise step of d's shape
    b.g.set_output((d, e, c))  # c is an output of the graph
    counts = _check(b, tmp_path)
    assert counts["fused"] == 0 and counts["native"] == 4


def test_steps_of_another_shape_are_not_fused(tmp_path):
    b = Builder()
    x = b.input(torch.randn(3, 1))
    wide = b.input(torch.randn(3, 5))
    r = b.call(aten.relu.default, x)  # [3, 1], read broadcast by a [3, 5] step: it stays a step of its own
    out = b.call(aten.add.Tensor, r, wide)
    t = b.call(aten.tanh.default, out)
    s = b.call(aten.sigmoid.default, t)
    b.g.set_output((s,))
    counts = _check(b, tmp_path, exact=False)
    assert counts["fused"] == 2 and counts["native"] == 2


@pytest.mark.parametrize("write_between", [True, False])
def test_a_write_to_an_input_stays_on_its_side_of_a_group(tmp_path, write_between):
    # A KV-cache style write into an input: a group whose steps run before and after it would read the
    # input after the write; a group wholly before (or after) it fuses
    b = Builder()
    x = b.input(torch.randn(4))
    src = b.input(torch.randn(4))
    if not write_between:
        b.call(aten.copy_.default, x, src)
    r = b.call(aten.relu.default, x)
    if write_between:
        b.call(aten.copy_.default, x, src)
    out = b.call(aten.mul.Tensor, r, 3.0)
    b.g.set_output((out,))
    config = rewrite.CompilerConfig()
    kernels = StaticKernels(config, CompileUnit.detached("fusion", config), str(tmp_path))
    plan = make_plan(b.g, observe(b.g, [t.clone() for t in b.inputs]), "cpu", native=kernels.decide,
                     fuse=kernels.fuse)
    kernels.build()
    run = PlannedExecutable(b.g, plan, ArenaPool("cpu"), kernels, compile_graph_to_python(b.g))
    assert plan.counts()["fused"] == (0 if write_between else 1)
    for _ in range(2):
        inputs = [t.clone() for t in b.inputs]
        want = compile_graph_to_python(b.g)(*[t.clone() for t in b.inputs])
        _same_bits(run(*inputs)[0], want[0], "after the write")


def test_fused_signatures_from_files_are_checked():
    x = {"dtype": "float32", "size": [4], "stride": [1]}
    relu = {"op": "aten.relu.default", "args": [["self", {"tensor": 0}]], "inputs": [x], "outputs": [x]}
    good = {"op": signature.FUSED, "inputs": [x], "outputs": [x],
            "args": [["steps", [{"signature": relu, "sources": [["input", 0]]},
                                {"signature": relu, "sources": [["step", 0]]}]]]}
    assert signature.check(good) is good
    bad = {
        "a step reading a later step": [{"signature": relu, "sources": [["step", 0]]}],
        "an input out of range": [{"signature": relu, "sources": [["input", 1]]}],
        "a source per input": [{"signature": relu, "sources": []}],
        "a nested fused signature": [{"signature": good, "sources": [["input", 0]]}],
        "an unknown field": [{"signature": relu, "sources": [["input", 0]], "code": "system()"}],
        "a step that is no signature": [{"signature": {"op": "aten.relu.default"}, "sources": [["input", 0]]}],
    }
    for why, steps in bad.items():
        with pytest.raises(signature.SignatureError):
            signature.check({**good, "args": [["steps", steps]]})
        assert why
    with pytest.raises(signature.SignatureError):
        signature.check({**good, "args": [["steps", []]]})
    with pytest.raises(signature.SignatureError):
        signature.check({**good, "outputs": [x, x]})
    # well-formed, but a step claims to read a layout its source does not hold: no kernel is made from it
    assert cgen.generate(good, "k_good") is not None
    other = {"dtype": "float32", "size": [2], "stride": [1]}
    for inputs in ([other], [{**x, "stride": [2]}], [{**x, "dtype": "float64"}]):
        assert cgen.generate(signature.check({**good, "inputs": inputs}), "k_bad") is None


class ConvBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(8)
        for bn in (self.bn1, self.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.nn.functional.relu6(self.bn2(self.conv2(y)) + x)


def test_the_default_mode_fuses_after_its_tier_up_and_matches_eager():
    model = ConvBlock().eval()
    x = torch.randn(2, 8, 10, 10)
    backend = rewrite.get_backend(rewrite.CompilerConfig())
    f = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        want = model(x)
        for _ in range(rewrite.CompilerConfig().exec.tier_up_calls + 2):  # past the tier-up
            got = f(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    notes = [n for g in backend.report.graphs for n in g.notes]
    assert any("steps fused into others" in n for n in notes), notes


def test_a_long_chain_fuses_in_groups_of_at_most_the_step_limit(tmp_path):
    b = Builder()
    x = b.input(torch.randn(5, 3))
    v = x
    for k in range(2 * signature.MAX_STEPS + 5):
        v = b.call(aten.mul.Tensor, v, 1.0 + k / 64) if k % 2 else b.call(aten.add.Tensor, v, 0.25)
    b.g.set_output((v,))
    counts = _check(b, tmp_path)
    # 69 steps: groups of 32, 32 and 5, each run by its last step
    assert counts["native"] == 3 and counts["fused"] == 2 * signature.MAX_STEPS + 5 - 3
