"""Declared shapes become gears (rewrite.gears.declared): ``mark_dynamic(t, d, min=, max=)`` and
``torch.compile(shapes_spec=...)`` ranges get a ladder of static graphs (or ``inference_config.declared_gears``)
instead of one dynamic graph; sizes between gears pad (or run the dynamic graph), sizes outside the range are
refused by Dynamo's guard of the declared range, and ``set_dim_gears`` wins where both are given."""
from __future__ import annotations

import logging

import pytest
import torch

import rewrite
from rewrite.gears.declared import Declared, ladder
from rewrite.torch_compat import dynamo_shapes_spec, shapes_spec_keyword

try:
    from torch.fx.experimental.dynamic_spec import ParamsSpec, ShapeVar, TensorSpec
except ImportError:  # torch 2.11 (the GPU machines) has no shapes_spec
    ShapeVar = None

needs_shapes_spec = pytest.mark.skipif(ShapeVar is None, reason="this torch has no torch.compile(shapes_spec=...)")
SPEC = shapes_spec_keyword()  # "shapes_spec" on torch 2.13, "dynamic_shapes" on 2.14 (rewrite.torch_compat)


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _calls_match_eager(compiled, model, sizes):
    with torch.no_grad():
        for rows in sizes:
            x = torch.randn(rows, 8)
            torch.testing.assert_close(compiled(x), model(x))


def test_the_default_ladder_keeps_the_ends_and_the_hint_and_at_most_ten_gears():
    assert ladder(Declared("B", 1, 64, 12)) == [1, 2, 4, 8, 12, 16, 32, 64]
    assert ladder(Declared("B", 3, 5)) == [3, 4, 5]
    wide = ladder(Declared("B", 1, 4096))
    assert len(wide) == 10 and wide[0] == 1 and wide[-1] == 4096 and wide == sorted(wide)
    assert ladder(Declared("B", 1, 64), most=3) == [1, 8, 64]  # the middle power, not the first
    assert ladder(Declared("B", 2, None)) == []  # no upper bound: no ladder


def test_a_mark_dynamic_range_is_served_by_gears_and_sizes_between_them_pad():
    model = _Mlp().eval()
    compiled = torch.compile(model, backend=rewrite.get_backend(rewrite.CompilerConfig()))
    x = torch.randn(16, 8)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=16)  # min=2: Dynamo specializes size 1 of a backed size itself
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    _calls_match_eager(compiled, model, [2, 4, 8, 16, 5, 3])
    stats = rewrite.stats(compiled)
    assert set(stats.gears) == {(2,), (4,), (8,), (16,)}, stats
    assert stats.pads == 2 and stats.recompiles == 0, stats  # 5 -> 8 and 3 -> 4, one graph for every size


def test_declared_gears_from_the_config_are_used_inside_the_range():
    model = _Mlp().eval()
    config = rewrite.CompilerConfig(**{"inference_config.declared_gears": [3, 12, 100]})  # 100 is outside: dropped
    compiled = torch.compile(model, backend=rewrite.get_backend(config))
    x = torch.randn(12, 8)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=12)
    with torch.no_grad():
        compiled(x)
    _calls_match_eager(compiled, model, [3, 12, 7])
    assert set(rewrite.stats(compiled).gears) == {(3,), (12,)} and rewrite.stats(compiled).pads == 1


def test_set_dim_gears_wins_over_a_declared_range():
    model = _Mlp().eval()
    compiled = torch.compile(model, backend=rewrite.get_backend(rewrite.CompilerConfig()))
    x = torch.randn(6, 8)
    torch._dynamo.mark_dynamic(x, 0, min=1, max=64)
    rewrite.inference.set_dim_gears(x, {0: [2, 6]})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))  # gears live on the tensor of the first call
    _calls_match_eager(compiled, model, [2, 6])
    assert set(rewrite.stats(compiled).gears) == {(2,), (6,)}



class _Masked(torch.nn.Module):
    def __init__(self, broadcast: bool = True):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.broadcast = broadcast

    def forward(self, x, mask):
        if self.broadcast:  # x and mask broadcast against each other: Dynamo guards their batch equal, one symbol
            return self.a(x) * mask[:, :, None]
        # mask read through its row numbers (transformers' mask functions): two batch symbols
        return self.a(x) * mask[torch.arange(x.shape[0])][:, :, None]


def _declared_gears(model, shapes, ranges, calls):
    backend = rewrite.get_backend(rewrite.CompilerConfig())
    compiled = torch.compile(model, backend=backend)
    first = [torch.randn(*shape) for shape in shapes]
    for t, dims in zip(first, ranges):
        for d, (low, high) in dims.items():
            torch._dynamo.mark_dynamic(t, d, min=low, max=high)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*first), model(*first))
        for call in calls:
            args = [t[tuple(slice(0, n) for n in size)] for t, size in zip(first, call)]
            torch.testing.assert_close(compiled(*args), model(*args))
    return sorted(g for r in backend.report.graphs for g in r.gears), rewrite.stats(compiled)


def test_dims_of_one_size_share_their_gears():
    gears, stats = _declared_gears(_Masked().eval(), [(8, 4, 8), (8, 4)], [{0: (2, 8)}, {0: (2, 8)}],
                                   [((b,), (b,)) for b in (2, 4, 8)])
    assert gears == [(2,), (4,), (8,)] and stats.pads == 0, (gears, stats)  # one symbol: the ladder of [2, 8]


def test_batch_dims_declared_alike_take_their_gears_together():
    gears, stats = _declared_gears(_Masked(broadcast=False).eval(), [(8, 4, 8), (8, 4)], [{0: (2, 8)}, {0: (2, 8)}],
                                   [((b,), (b,)) for b in (2, 4, 8)])
    # two symbols, the same range: zipped (the default merge policy), not 3 x 3 combinations no call can have
    assert gears == [(2, 2), (4, 4), (8, 8)], gears
    assert stats.pads == 0 and stats.dynamic_fallbacks == 0, stats


def test_independent_declared_dims_take_every_combination():
    gears, _ = _declared_gears(_Masked().eval(), [(4, 8, 8), (4, 8)], [{0: (2, 4), 1: (2, 8)}, {0: (2, 4), 1: (2, 8)}],
                               [((2, 2), (2, 2)), ((4, 8), (4, 8))])
    assert gears == [(2, 2), (2, 4), (2, 8), (4, 2), (4, 4), (4, 8)], gears  # batch [2, 4] x sequence [2, 4, 8]


@needs_shapes_spec
def test_torch_compat_finds_the_spec_keyword_and_the_spec_dynamo_compiles_with():
    """rewrite.torch_compat names this torch's spelling (torch.compile's keyword, Dynamo's config field): what
    rewrite.gears.declared reads the ShapeVars from."""
    assert SPEC in ("shapes_spec", "dynamic_shapes"), SPEC
    assert dynamo_shapes_spec() is None  # outside a compile
    seen = []

    def backend(gm, example_inputs):
        seen.append(dynamo_shapes_spec())
        return gm

    spec = ParamsSpec({"x": TensorSpec([ShapeVar("B", min=1, max=8), None])})
    torch.compile(_Mlp().eval(), backend=backend, **{SPEC: spec})(torch.randn(4, 8))
    assert len(seen) == 1 and seen[0] is not None and seen[0]._params is not None, seen


@needs_shapes_spec
def test_a_range_without_an_upper_bound_stays_one_dynamic_graph(caplog):
    model = _Mlp().eval()
    caplog.set_level(logging.INFO, logger="rewrite")
    compiled = torch.compile(model, backend=rewrite.get_backend(rewrite.CompilerConfig()),
                             **{SPEC: ParamsSpec({"x": TensorSpec([ShapeVar("B", min=1), None])})})
    _calls_match_eager(compiled, model, [6, 3, 9])
    assert "no upper bound" in caplog.text and not rewrite.stats(compiled).gears


@needs_shapes_spec
def test_a_shape_var_gets_gears_with_its_hint_and_a_size_outside_its_range_is_refused():
    model = _Mlp().eval()
    batch = ShapeVar("B", min=1, max=32, optimization_hint=12)
    compiled = torch.compile(model, backend=rewrite.get_backend(rewrite.CompilerConfig()),
                             **{SPEC: ParamsSpec({"x": TensorSpec([batch, None])})})
    _calls_match_eager(compiled, model, [12, 1, 32, 7])
    stats = rewrite.stats(compiled)
    assert (12,) in stats.gears and stats.recompiles == 0, stats
    # outside the range: refused before Dynamo's own guard of the range fails its new trace (an internal
    # AssertionError in torch 2.13), naming the ShapeVar, its range and the size; a GearError the caller can catch
    with pytest.raises(rewrite.gears.OutsideDeclaredRange, match=r"input x dim 0 has size 40, outside the range "
                                                                  r"ShapeVar 'B' declares \[1, 32\]"), torch.no_grad():
        compiled(torch.randn(40, 8))
    assert issubclass(rewrite.gears.OutsideDeclaredRange, rewrite.gears.GearError)


@needs_shapes_spec
def test_a_shapes_spec_training_graph_compiles_its_backward_and_matches_eager(caplog):
    """AOTAutograd compiles the backward of a graph with unbacked sizes eagerly, under its fake mode; folding
    there made fake constants, and the compile failed (only logged) until the backward was compiled outside it."""
    model = _Mlp()
    batch = ShapeVar("B", min=1, max=64, optimization_hint=16)
    compiled = torch.compile(model, backend=rewrite.get_backend(rewrite.CompilerConfig()),
                             **{SPEC: ParamsSpec({"x": TensorSpec([batch, None])})})
    caplog.set_level(logging.WARNING)
    x = torch.randn(8, 8)
    compiled(x).sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad)
    assert "Failed to eagerly compile backwards" not in caplog.text


def test_declared_gears_per_axis_give_batch_and_sequence_their_own_sizes():
    """One list for all dims put batch sizes into the sequence range too; a dict gives each gear axis its own, by
    'argument:dim' (or a ShapeVar's name). ids and mask batch (two symbols, declared alike) are one axis."""
    model = _Masked(broadcast=False).eval()
    config = rewrite.CompilerConfig(**{"inference_config.declared_gears": {"x:0": [2, 4], "x:1": [3, 8]}})
    backend = rewrite.get_backend(config)
    compiled = torch.compile(model, backend=backend)
    x, m = torch.randn(4, 8, 8), torch.randn(4, 8)
    for t in (x, m):
        torch._dynamo.mark_dynamic(t, 0, min=2, max=4)
        torch._dynamo.mark_dynamic(t, 1, min=2, max=8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, m), model(x, m))
    (graph,) = backend.report.graphs
    assert sorted(graph.gears) == [(2, 3, 2), (2, 8, 2), (4, 3, 4), (4, 8, 4)], graph.gears  # |B| x |L|


def test_declared_gears_are_checked_when_assigned():
    config = rewrite.CompilerConfig()
    config.inference_config.declared_gears = {"batch": (4, 1, 4)}
    assert config.inference_config.declared_gears == {"batch": [1, 4]}
    with pytest.raises(rewrite.config.ConfigError, match=r"declared_gears\['batch'\]\[0\] = 0"):
        config.inference_config.declared_gears = {"batch": [0]}
    with pytest.raises(rewrite.config.ConfigError, match="keys are ShapeVar names or 'argument:dim'"):
        config.inference_config.declared_gears = {3: [1]}
