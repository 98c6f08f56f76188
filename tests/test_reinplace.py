"""In-place buffer updates (rewrite.passes.reinplace): a static KV cache's functionalized update
``copy_(cache, index_put(cache, ...))`` runs as one ``index_put_``, only where nothing else reads the
cache, and the program computes and writes what it did before."""
from __future__ import annotations

import sympy
import torch

import rewrite
from rewrite.exec import compile_graph_to_python
from rewrite.ir import Graph, TensorMeta
from rewrite.passes import reinplace_buffer_updates

from conftest import tiny_llama

aten = torch.ops.aten


def meta(*shape, dtype=torch.float32):
    return TensorMeta(dtype, tuple(sympy.Integer(s) for s in shape))


def cache_step(extra_reader: bool = False) -> Graph:
    """cache [2, 6, 4]; rows ``pos`` of dim 1 set to ``v``; output: the updated cache times 2 (the
    attention's read), and with ``extra_reader`` the old cache's sum too (read after the update)."""
    g = Graph("step")
    cache = g.placeholder("cache", meta(2, 6, 4))
    pos = g.placeholder("pos", meta(1, dtype=torch.int64))
    v = g.placeholder("v", meta(2, 1, 4))
    new = g.call(aten.index_put.default, (cache, [None, pos], v), meta=meta(2, 6, 4))
    read = g.call(aten.mul.Tensor, (new, 2.0), meta=meta(2, 6, 4))
    outs = [read]
    if extra_reader:
        outs.append(g.call(aten.sum.default, (cache,), meta=TensorMeta(torch.float32, ())))
    g.call(aten.copy_.default, (cache, new), meta=meta(2, 6, 4))
    g.set_output(tuple(outs))
    return g


def run(g: Graph):
    torch.manual_seed(0)
    cache, pos, v = torch.randn(2, 6, 4), torch.tensor([3]), torch.randn(2, 1, 4)
    out = compile_graph_to_python(g)(cache, pos, v)
    return out, cache


def test_the_update_and_its_write_back_become_one_in_place_update_with_the_same_results():
    g = cache_step()
    want, want_cache = run(g.copy())
    assert reinplace_buffer_updates(g) == 1
    assert g.op_counts() == {"aten.index_put_.default": 1, "aten.mul.Tensor": 1}
    got, got_cache = run(g)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got_cache, want_cache, rtol=0, atol=0)  # the buffer holds the new rows, as before
    assert reinplace_buffer_updates(g) == 0  # nothing left to do


def test_a_buffer_read_by_anything_else_is_left_functional():
    g = cache_step(extra_reader=True)  # the old cache's sum would see the new rows if written in place
    assert reinplace_buffer_updates(g) == 0
    assert g.op_counts()["aten.copy_.default"] == 1


def test_a_buffer_that_is_also_an_output_is_left_functional():
    g = cache_step()
    cache = g.placeholders[0]
    g.set_output((*g.outputs, cache))
    assert reinplace_buffer_updates(g) == 0


def test_static_cache_generate_matches_eager_and_writes_the_caches_in_place():
    model, ids = tiny_llama()

    def generate(m):
        with torch.no_grad():
            return m.generate(ids, max_new_tokens=14, min_new_tokens=14, do_sample=False, cache_implementation="static")

    want = generate(model)
    backend = rewrite.get_backend()
    model.forward = torch.compile(model.forward, backend=backend, dynamic=False)
    assert torch.equal(generate(model), want)  # 14 steps: past the step graph's tier-up
    assert torch.equal(generate(model), want)
    reinplaced = sum(g.applied.get("reinplace", 0) for g in backend.report.graphs)
    assert reinplaced >= 2 * 2  # K and V of both layers, in the step graph at least
    step = backend.report.graphs[-1]
    assert step.ops_after.get("aten.index_put_.default", 0) == 4 and not step.ops_after.get("aten.index_put.default")
