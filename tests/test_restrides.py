"""Restrides that change no value (rewrite.passes.restrides): AOTAutograd's ``as_strided`` after a global pool
of a channels-last image is dropped, so the e-graph runs; every restride that could read another element stays."""
from __future__ import annotations

import pytest
import sympy
import torch

import rewrite
from rewrite.ir import Graph, TensorMeta
from rewrite.optimizer import egraph_unsupported
from rewrite.passes import drop_trivial_restrides

aten = torch.ops.aten


def meta(*shape):
    return TensorMeta(torch.float32, tuple(sympy.Integer(s) for s in shape), torch.device("cpu"))


class PooledHead(torch.nn.Module):
    """ConvNeXt's head (timm): NHWC tokens permuted to a channels-last NCHW image, average-pooled, a linear."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        image = self.norm(x).permute(0, 3, 1, 2)
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(image, 1).flatten(1))


@pytest.mark.parametrize("batch", [1, 2])
def test_a_global_pool_s_restride_is_dropped_and_the_rules_run(batch):
    torch.manual_seed(0)
    model = PooledHead().eval()
    x = torch.randn(batch, 5, 5, 8)
    backend = rewrite.get_backend(rewrite.CompilerConfig())
    with torch.no_grad():
        got = torch.compile(model, backend=backend, dynamic=False)(x)
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
    (graph,) = backend.report.graphs
    skipped = [n for n in graph.notes if "e-graph skipped" in n]
    if batch == 1:  # [1, 8, 1, 1]: one long dim, stride 1
        assert graph.ops_before.get("aten.as_strided.default") == 1
        assert not graph.ops_after.get("aten.as_strided.default") and not skipped, graph.notes
        assert "trivial_restrides" in graph.applied
    else:  # [2, 8, 1, 1]: two long dims, the layout decides which element each reads: kept, the e-graph skipped
        assert graph.ops_after.get("aten.as_strided.default") == 1 and skipped


def _restride(source: str, size, stride, offset=None, returned=False):
    g = Graph("restride")
    x = g.placeholder("x", meta(2, 8, 3, 3))
    if source == "input":
        src = g.placeholder("v", meta(*size))
    elif source in ("view", "unsafe_view"):
        view = aten.view.default if source == "view" else aten._unsafe_view.default
        src = g.call(view, (g.call(aten.relu.default, (x,), meta=meta(2, 8, 3, 3)), list(size)), meta=meta(*size))
    else:
        src = g.call(aten.mean.dim, (x, [-1, -2], True), meta=meta(2, 8, 1, 1))
        if list(size) != [2, 8, 1, 1]:
            src = g.call(aten.sum.dim_IntList, (src, [0], True), meta=meta(*size))
    args = (src, list(size), list(stride)) + (() if offset is None else (offset,))
    r = g.call(aten.as_strided.default, args, meta=meta(*size))
    g.set_output((r,) if returned else (g.call(aten.relu.default, (r,), meta=meta(*size)),))
    return g


def test_a_restride_of_a_fresh_result_with_one_long_dim_is_its_input():
    g = _restride("fresh", [1, 8, 1, 1], [8, 1, 8, 8])
    assert egraph_unsupported(g) is not None
    assert drop_trivial_restrides(g) == 1
    assert "aten.as_strided.default" not in g.op_counts() and egraph_unsupported(g) is None
    assert drop_trivial_restrides(_restride("fresh", [1, 8, 1, 1], [8, 1, 8, 8], offset=0)) == 1


@pytest.mark.parametrize("case", [
    dict(source="fresh", size=[2, 8, 1, 1], stride=[8, 1, 8, 8]),  # two long dims: the layout matters
    dict(source="fresh", size=[1, 8, 1, 1], stride=[8, 2, 8, 8]),  # every other element
    dict(source="fresh", size=[1, 8, 1, 1], stride=[8, 1, 8, 8], offset=1),  # from an offset
    dict(source="input", size=[1, 8, 1, 1], stride=[8, 1, 8, 8]),  # the caller's tensor: any layout or offset
    dict(source="view", size=[1, 144, 1, 1], stride=[144, 1, 144, 144]),  # a view (of any layout and offset)
    dict(source="unsafe_view", size=[1, 144, 1, 1], stride=[144, 1, 144, 144]),  # a view its schema does not name
    dict(source="fresh", size=[1, 8, 1, 1], stride=[8, 1, 8, 8], returned=True),  # the caller sees its strides
], ids=["two-long-dims", "stride-2", "offset", "input", "view", "unsafe-view", "returned"])
def test_every_restride_that_may_read_another_element_stays(case):
    g = _restride(**case)
    assert drop_trivial_restrides(g) == 0
    assert g.op_counts().get("aten.as_strided.default") == 1
