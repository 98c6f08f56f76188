"""Dynamic-shape gears: declaration checks, merge policies, one compile serving every gear,
dispatch errors, padding (and its refusal), the Inductor kernel backend, real models vs eager."""
from __future__ import annotations

import logging

import pytest
import torch
from torch._dynamo.utils import counters

import rewrite
from rewrite import models
from rewrite.gears import MAX_GEARS, GearError, get_dim_gears, merge_gears, set_dim_gears
from rewrite.gears.spec import InputGears


def unique_graphs() -> int:
    return counters["stats"]["unique_graphs"]


# -- set_dim_gears: every validation error -------------------------------------------------------

@pytest.mark.parametrize("dim_gears, message", [
    ({3: [2, 4]}, "dim 3 is out of range for a tensor of rank 2"),
    ({-3: [2, 4]}, "dim -3 is out of range"),
    ({"0": [2, 4]}, "dim '0' must be an int"),
    ({True: [2, 4]}, "dim True must be an int"),
    ({0: []}, "must be a non-empty list"),
    ({0: 4}, "must be a non-empty list"),
    ({0: [2, 0]}, "gear value 0 of dim 0 is not allowed"),
    ({0: [2, -4]}, "gear value -4"),
    ({0: [2, 4.0]}, "gear value 4.0"),
    ({0: [True, 2]}, "gear value True"),
    ({1: [2], -1: [3]}, "name the same dimension"),
    ({}, "non-empty dict"),
    ([2, 4], "non-empty dict"),
])
def test_set_dim_gears_rejects_bad_declarations(dim_gears, message):
    x = torch.ones(2, 3)
    with pytest.raises(GearError, match=message.replace("(", r"\(").replace("[", r"\[")):
        set_dim_gears(x, dim_gears)
    assert get_dim_gears(x) == {}


def test_set_dim_gears_rejects_non_tensor():
    with pytest.raises(GearError, match="expected a torch.Tensor, got list"):
        set_dim_gears([1, 2], {0: [2]})


def test_set_dim_gears_same_again_is_fine_different_is_an_error():
    x = torch.ones(2, 3)
    set_dim_gears(x, {-2: [2, 4]})
    assert get_dim_gears(x) == {0: (2, 4)}  # negative dims are normalized
    set_dim_gears(x, {0: [2, 4]})  # the same gears again
    with pytest.raises(GearError, match=r"already has gears \{0: \[2, 4\]\}.*different gears \{0: \[2, 8\]\}"):
        set_dim_gears(x, {0: [2, 8]})
    # issue 15 (TorchAir's rule): adding a dim is a different dict too
    with pytest.raises(AssertionError, match=r"already has gears .*different gears \{1: \[3, 6\]\}"):
        set_dim_gears(x, {1: [3, 6]})
    assert get_dim_gears(x) == {0: (2, 4)}


def test_set_dim_gears_marks_dims_dynamic():
    x = torch.ones(2, 3, 4)
    set_dim_gears(x, {0: [2, 4], -1: [4, 8]})
    assert x._dynamo_dynamic_indices == {0, 2}


# -- merge policies and the limit ----------------------------------------------------------------

def _inp(index, dims, name=None):
    return InputGears(index, name or f"x{index}", {d: tuple(v) for d, v in dims.items()}, ())


def test_zip_within_a_tensor_is_position_by_position():
    # The seed's example: six gears of a (2, 10) input by zip.
    gears = merge_gears([_inp(0, {0: [2, 3, 4, 2, 3, 4], 1: [10, 10, 10, 20, 20, 20]})], "zip")
    assert [(g[(0, 0)], g[(0, 1)]) for g in gears] == [(2, 10), (3, 10), (4, 10), (2, 20), (3, 20), (4, 20)]


def test_product_within_a_tensor_is_cartesian():
    gears = merge_gears([_inp(0, {0: [2, 3, 4], 1: [10, 20]})], "product")
    assert sorted((g[(0, 0)], g[(0, 1)]) for g in gears) == [(2, 10), (2, 20), (3, 10), (3, 20), (4, 10), (4, 20)]


def test_zip_and_product_across_tensors():
    a, b = _inp(0, {0: [2, 4]}), _inp(1, {0: [2, 4]})
    assert [(g[(0, 0)], g[(1, 0)]) for g in merge_gears([a, b], "zip")] == [(2, 2), (4, 4)]
    assert [(g[(0, 0)], g[(1, 0)]) for g in merge_gears([a, b], "product")] == [(2, 2), (2, 4), (4, 2), (4, 4)]


def test_zip_needs_equal_lengths():
    with pytest.raises(GearError, match=r"same length, got lengths \{0: 2, 1: 3\}"):
        merge_gears([_inp(0, {0: [2, 4], 1: [1, 2, 3]})], "zip")
    with pytest.raises(GearError, match=r"same number of gears, got \{'a': 2, 'b': 3\}"):
        merge_gears([_inp(0, {0: [2, 4]}, "a"), _inp(1, {0: [2, 4, 8]}, "b")], "zip")


def test_at_most_100_gears_and_the_error_states_the_count():
    assert MAX_GEARS == 100
    assert len(merge_gears([_inp(0, {0: list(range(1, 11)), 1: list(range(1, 11))})], "product")) == 100
    with pytest.raises(GearError, match="110 gears declared .*at most 100"):
        merge_gears([_inp(0, {0: list(range(1, 12)), 1: list(range(1, 11))})], "product")
    with pytest.raises(GearError, match="101 gears declared"):
        merge_gears([_inp(0, {0: list(range(1, 102))})], "zip")


def test_duplicate_gears_are_merged():
    gears = merge_gears([_inp(0, {0: [2, 2, 4]})], "zip")
    assert [g[(0, 0)] for g in gears] == [2, 4]


# -- compile once, dispatch, errors --------------------------------------------------------------

class AddSoftmax(torch.nn.Module):
    """Rows of dim 0 stay independent (padding is allowed); returns a size too."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, y):
        h = torch.softmax(self.lin(x) + y, -1).reshape(x.shape[0], -1)
        return h * 2, x.shape[0] * 3


class SumOverBatch(AddSoftmax):
    """Reduces across dim 0: padding it would change the result."""

    def forward(self, x, y):
        return (torch.softmax(self.lin(x) + y, -1).sum(0),)


def _compile(model, config=None):
    backend = rewrite.get_backend(config or rewrite.CompilerConfig())
    return torch.compile(model, backend=backend, fullgraph=True), backend


def _pair(b, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 3, 4, generator=g), torch.randn(b, 3, 4, generator=g)


def _check(fn, model, x, y):
    out, ref = fn(x, y), model(x, y)
    for o, r in zip(out, ref):
        if isinstance(r, torch.Tensor):
            assert o.shape == r.shape
            torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
        else:
            assert o == r


def test_every_gear_including_1_compiles_once_and_matches_eager(caplog):
    model = AddSoftmax().eval()
    fn, backend = _compile(model)
    x, y = _pair(2)
    set_dim_gears(x, {0: [1, 2, 4, 8]})
    set_dim_gears(y, {0: [1, 2, 4, 8]})
    counters.clear()
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="rewrite"):
        _check(fn, model, x, y)
        for b in [1, 8, 4, 2, 1]:
            _check(fn, model, *_pair(b, seed=b))
    assert unique_graphs() == 1, "a gear shape recompiled"
    (graph_report,) = backend.report.graphs
    assert sorted(graph_report.gears) == [(1,), (2,), (4,), (8,)]
    assert all(sum(c.values()) > 0 for c in graph_report.gears.values())
    text = caplog.text
    assert "inputShape = L['x']:-1,3,4;L['y']:-1,3,4" in text
    assert "dynamicDims = 1,1;2,2;4,4;8,8" in text
    assert torch.fx.experimental._config.backed_size_oblivious is False  # restored after the first run


@pytest.mark.parametrize("geared", [True, False], ids=["gears", "static"])
def test_two_equal_views_of_an_input_stay_two_views_of_it(geared):
    """CSE makes the two narrows one node; the second output must still be the same view of x (found
    by `make fuzz`: with gears, AOTAutograd rebuilt it from x with a clone's offset 0, so it returned
    x[0:3] instead of x[1:4])."""
    def program(x):
        return x.narrow(0, 1, x.shape[0] - 1), x.narrow(0, 1, x.shape[0] - 1)

    x = torch.tensor([True, False, True, True])
    arg = x.clone()
    if geared:
        set_dim_gears(arg, {0: [4]})
    compiled = torch.compile(program, backend=rewrite.get_backend(), fullgraph=True, dynamic=None if geared else False)
    first, second = compiled(arg)
    assert first.tolist() == second.tolist() == [False, True, True]
    assert first is not second
    arg[2] = False  # both are views of the input, as in eager
    assert first.tolist() == second.tolist() == [False, False, True]


def test_shape_outside_the_gears_names_input_dim_value_and_gears():
    model = AddSoftmax().eval()
    fn, _ = _compile(model)
    x, y = _pair(2)
    set_dim_gears(x, {0: [2, 4]})
    set_dim_gears(y, {0: [2, 4]})
    with torch.no_grad():
        fn(x, y)
        with pytest.raises(GearError, match=r"input x dim 0 has size 3; allowed gears for it: \[2, 4\]"):
            fn(*_pair(3))


def test_product_drops_gears_the_graph_ties_together():
    # x + y ties dim 0 of x and y to one size: of the product's 4 gears only (2, 2) and (4, 4) can exist.
    model = AddSoftmax().eval()
    config = rewrite.CompilerConfig()
    config.inference_config.dynamic_gears_merge_policy = "product"
    fn, backend = _compile(model, config)
    x, y = _pair(2)
    set_dim_gears(x, {0: [2, 4]})
    set_dim_gears(y, {0: [2, 4]})
    with torch.no_grad():
        _check(fn, model, x, y)
        _check(fn, model, *_pair(4))
    assert sorted(backend.report.graphs[0].gears) == [(2,), (4,)]


class TwoSizes(torch.nn.Module):
    def forward(self, x, y):
        return x.sum(1, keepdim=True) * y.mean(), y.shape[0] + x.shape[0]


def test_product_of_independent_dims_compiles_every_combination():
    model = TwoSizes()
    config = rewrite.CompilerConfig()
    config.inference_config.dynamic_gears_merge_policy = "product"
    fn, backend = _compile(model, config)
    x, y = torch.randn(2, 5), torch.randn(3)
    set_dim_gears(x, {0: [2, 4]})
    set_dim_gears(y, {0: [3, 6]})
    counters.clear()
    with torch.no_grad():
        for a, b in [(2, 3), (2, 6), (4, 3), (4, 6)]:
            xx, yy = (x, y) if (a, b) == (2, 3) else (torch.randn(a, 5), torch.randn(b))
            out, ref = fn(xx, yy), model(xx, yy)
            torch.testing.assert_close(out[0], ref[0])
            assert out[1] == ref[1]
        with pytest.raises(GearError, match=r"input y dim 0 has size 5; allowed gears for it: \[3, 6\]"):
            fn(torch.randn(2, 5), torch.randn(5))
    assert unique_graphs() == 1
    assert len(backend.report.graphs[0].gears) == 4


def test_dynamic_fallback_runs_the_symbolic_graph():
    model = AddSoftmax().eval()
    config = rewrite.CompilerConfig()
    config.inference_config.gear_fallback = "dynamic"
    fn, _ = _compile(model, config)
    x, y = _pair(2)
    set_dim_gears(x, {0: [2, 4]})
    set_dim_gears(y, {0: [2, 4]})
    counters.clear()
    with torch.no_grad():
        _check(fn, model, x, y)
        for b in (3, 7, 1):
            _check(fn, model, *_pair(b, seed=b))
    assert unique_graphs() == 1


class BranchOnBatch(torch.nn.Module):
    def forward(self, x):
        return x * 2 if x.shape[0] > 3 else x * 3


def test_gears_the_trace_contradicts_are_left_out_and_traced_separately():
    # Tracing at batch 4 records the guard s > 3: gear 2 cannot use that graph.
    model = BranchOnBatch()
    fn, backend = _compile(model)
    x = torch.randn(4, 3)
    set_dim_gears(x, {0: [2, 4, 8]})
    counters.clear()
    with torch.no_grad():
        torch.testing.assert_close(fn(x), x * 2)
        x8 = torch.randn(8, 3)
        torch.testing.assert_close(fn(x8), x8 * 2)
        assert unique_graphs() == 1
        first = backend.report.graphs[0]
        assert sorted(first.gears) == [(4,), (8,)]
        assert any("gear (2,) left out" in n for n in first.notes)
        x2 = torch.randn(2, 3)
        torch.testing.assert_close(fn(x2), x2 * 3)  # Dynamo's guard fails: a second trace serves it
    assert unique_graphs() == 2


def test_a_first_call_whose_gear_the_model_code_branches_away_from_is_traced_at_its_own_size():
    # Gears are traced at the largest gear (8): the model's own branch records s > 3, which the first
    # call's gear 2 contradicts; its trace restarts at size 2 instead of failing, and later calls at the
    # larger gears get the general graph.
    model = BranchOnBatch()
    fn, backend = _compile(model)
    x = torch.randn(2, 3)
    set_dim_gears(x, {0: [2, 4, 8]})
    counters.clear()
    with torch.no_grad():
        torch.testing.assert_close(fn(x), x * 3)
        for b in (4, 8, 2):
            xb = torch.randn(b, 3)
            torch.testing.assert_close(fn(xb), xb * (2 if b > 3 else 3))
    assert unique_graphs() == 2


# -- padding -------------------------------------------------------------------------------------

def test_pad_fallback_pads_to_the_smallest_larger_gear_and_slices_back(caplog):
    model = AddSoftmax().eval()
    config = rewrite.CompilerConfig()
    config.inference_config.gear_fallback = "pad"
    fn, _ = _compile(model, config)
    x, y = _pair(2)
    set_dim_gears(x, {0: [2, 4, 8]})
    set_dim_gears(y, {0: [2, 4, 8]})
    counters.clear()
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="rewrite"):
        _check(fn, model, x, y)
        for b in (1, 3, 5, 7):
            _check(fn, model, *_pair(b, seed=b))  # outputs sliced back; the size output is the real one
        with pytest.raises(GearError, match="no gear is larger"):
            fn(*_pair(9))
    assert unique_graphs() == 1
    assert "= 3 is not a gear; padding up to gear (4,)" in caplog.text
    assert "= 5 is not a gear; padding up to gear (8,)" in caplog.text


def test_pad_refused_at_call_time_says_so_like_every_other_refusal():
    """Whether padding works can depend on the sizes (here: rows in blocks of the padded size
    itself); a refusal found at the call names the shape and the gears as every refusal does
    (found by `make fuzz`)."""
    def program(x):
        return torch.arange(x.view(x.shape[0] * x.shape[1], x.shape[2]).shape[0])

    config = rewrite.CompilerConfig()
    config.inference_config.gear_fallback = "pad"
    fn = torch.compile(program, backend=rewrite.get_backend(config), fullgraph=True)
    x = torch.zeros(3, 3, 4)
    set_dim_gears(x, {0: [3, 6], 1: [3, 6]})
    assert fn(x).tolist() == list(range(9))
    assert fn(torch.zeros(6, 6, 4)).shape == (36,)
    with pytest.raises(GearError, match=r"not one of the compiled gears: .*has size 4; allowed gears for it: \[3, 6\]"
                                        r".* and padding is not possible: cannot pad to gear \(6, 6\)"):
        fn(torch.zeros(4, 4, 4))


def test_pad_is_refused_when_a_reduction_mixes_the_padded_dim():
    model = SumOverBatch().eval()
    config = rewrite.CompilerConfig()
    config.inference_config.gear_fallback = "pad"
    fn, _ = _compile(model, config)
    x, y = _pair(2)
    set_dim_gears(x, {0: [2, 4]})
    set_dim_gears(y, {0: [2, 4]})
    with torch.no_grad():
        _check(fn, model, x, y)
        with pytest.raises(GearError, match=r"padding is not possible: .*\(aten.sum.dim_IntList\) reduces across "
                                            r"the rows"):
            fn(*_pair(3))


def test_row_proof_follows_flattening_views_and_refuses_attention_over_rows():
    from rewrite.fx_bridge import from_fx
    from rewrite.gears.padding import NotRowwise, Row, row_states

    def trace(fn, *shapes):
        from torch.fx.experimental.proxy_tensor import make_fx

        gm = make_fx(fn, tracing_mode="symbolic")(*[torch.randn(*s) for s in shapes])
        return from_fx(gm)

    # [b, t, h] -> [b*t, h] @ w -> [b, t, h]: rows of b survive the flattening (k = t).
    g = trace(lambda x, w: (x.reshape(-1, x.shape[-1]) @ w).reshape(x.shape), (3, 5, 4), (4, 4))
    b = g.placeholders[0].meta.shape[0]
    states = row_states(g, b)
    out = g.outputs[0] if isinstance(g.outputs, (tuple, list)) else g.outputs
    assert states[out.id] == Row(0)
    # Along the sequence dim, attention mixes rows: refused, naming the op.
    attn = trace(lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q), (2, 3, 5, 4))
    s = attn.placeholders[0].meta.shape[2]
    with pytest.raises(NotRowwise, match="attention|rows"):
        row_states(attn, s)
    # Along the batch dim, attention keeps rows apart.
    bsym = attn.placeholders[0].meta.shape[0]
    states = row_states(attn, bsym)
    out = attn.outputs[0] if isinstance(attn.outputs, (tuple, list)) else attn.outputs
    assert states[out.id] == Row(0)



def _symbolic(fn, *shapes):
    from torch.fx.experimental.proxy_tensor import make_fx

    from rewrite.fx_bridge import from_fx

    return from_fx(make_fx(fn, tracing_mode="symbolic")(*[torch.randn(*s) for s in shapes]))


def _out_state(g, states):
    return states[(g.outputs[0] if isinstance(g.outputs, (tuple, list)) else g.outputs).id]


def _rows_of(m):  # transformers' mask functions: mask[batch_arange[:, None, None, None], kv_arange]
    return m[torch.arange(m.shape[0])[:, None, None, None], torch.arange(m.shape[1])]


@pytest.mark.parametrize("fn, shapes", [
    (_rows_of, [(3, 5)]),  # the row dim indexed by the row numbers themselves
    (lambda m: m[torch.arange(m.shape[0]).view(-1, 1).contiguous(), 2], [(3, 5)]),  # through a view and a copy
    (lambda t, i: t[i.long()], [(10, 4), (3,)]),  # a lookup into a table without rows, as embedding
])
def test_row_proof_keeps_rows_through_an_index_by_the_row_numbers(fn, shapes):
    from rewrite.gears.padding import Row, row_states

    g = _symbolic(fn, *shapes)
    b = g.placeholders[-1].meta.shape[0]
    assert _out_state(g, row_states(g, b)) == Row(0)


@pytest.mark.parametrize("fn, shapes, reason", [
    (lambda m: m[m.shape[0] - 1 - torch.arange(m.shape[0])], [(3, 5)], "depends on the padded size"),  # reversed
    (lambda m: m[torch.arange(m.shape[0]).to(torch.int8).long()], [(3, 5)], "other than the row numbers"),  # wraps
    (lambda m, i: m[i.long()], [(3, 5), (3,)], "other than the row numbers"),  # rows picked by the data
    (lambda m: m[torch.arange(m.shape[0]) * 0], [(3, 5)], "other than the row numbers"),  # every row reads row 0
    (lambda m: m[m > 0], [(3, 5)], "by a mask"),  # the result's size depends on the values
    # a row's index is the row number only in its first column: the second reads the data
    (lambda m, i: m[torch.cat([torch.arange(m.shape[0])[:, None], i.long()[:, None]], 1)], [(3, 5), (3,)],
     "other than the row numbers"),
])
def test_row_proof_refuses_an_index_that_reads_other_rows(fn, shapes, reason):
    from rewrite.gears.padding import NotRowwise, row_states

    g = _symbolic(fn, *shapes)
    with pytest.raises(NotRowwise, match=reason):
        row_states(g, g.placeholders[0].meta.shape[0])


class MaskedByIndex(torch.nn.Module):
    def forward(self, x, mask):
        keep = _rows_of(mask)[:, 0, 0, :]  # [b, k]: row r of the mask, through an index by the row numbers
        return (torch.softmax(x.masked_fill(keep[:, None, :] == 0, -1e4), dim=-1),)


def test_pad_serves_a_mask_read_through_an_index_by_the_row_numbers():
    model = MaskedByIndex().eval()
    config = rewrite.CompilerConfig()
    config.inference_config.gear_fallback = "pad"
    fn, _ = _compile(model, config)

    def pair(b, seed=0):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(b, 4, 6, generator=g), (torch.rand(b, 6, generator=g) > 0.3).long()

    x, mask = pair(4)
    set_dim_gears(x, {0: [2, 4, 8]})
    set_dim_gears(mask, {0: [2, 4, 8]})
    counters.clear()
    with torch.no_grad():
        _check(fn, model, x, mask)
        for b in (3, 5, 7, 1):
            _check(fn, model, *pair(b, seed=b))
    assert rewrite.stats(fn).pads == 4


# -- the Inductor kernel backend -----------------------------------------------------------------

def test_inductor_kernels_compile_each_gear_graph(monkeypatch):
    import rewrite.exec.inductor as inductor

    compiled = []
    real = inductor.compile_with_inductor

    def counting(graph):
        compiled.append(graph.is_static())
        return real(graph)

    monkeypatch.setattr(inductor, "compile_with_inductor", counting)
    model = AddSoftmax().eval()
    config = rewrite.CompilerConfig()
    config.exec.kernels = "inductor"
    config.inference_config.gear_fallback = "dynamic"
    fn, _ = _compile(model, config)
    x, y = _pair(2)
    set_dim_gears(x, {0: [1, 2]})
    set_dim_gears(y, {0: [1, 2]})
    counters.clear()
    with torch.no_grad():
        _check(fn, model, x, y)
        _check(fn, model, *_pair(1, seed=1))
        _check(fn, model, *_pair(5, seed=5))  # no gear: Inductor's size-generic code of the symbolic graph
    # One Inductor compile per gear on a static graph, then the symbolic graph for the fallback.
    assert compiled == [True, True, False]
    assert unique_graphs() == 1


def test_inductor_kernels_take_large_frozen_weights_as_inputs(monkeypatch):
    """Weights above LIFT_NUMEL reach Inductor as inputs (its cache key hashes baked constants by
    value); the small ones stay constants, and results equal eager at the gears and in between."""
    import rewrite.exec.inductor as inductor

    lifted = []
    real = inductor._lift_constants

    def recording(graph):
        g, values = real(graph)
        lifted.append(([v.shape for v in values], len(g.placeholders) - len(graph.placeholders),
                       sum(n.kind == "constant" for n in graph.nodes) - sum(n.kind == "constant" for n in g.nodes)))
        return g, values

    monkeypatch.setattr(inductor, "_lift_constants", recording)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.GELU(), torch.nn.Linear(48, 8)).eval()
    config = rewrite.CompilerConfig()
    config.exec.kernels = "inductor"
    config.experimental_config.frozen_parameter = True
    config.inference_config.gear_fallback = "dynamic"
    fn = torch.compile(model, backend=rewrite.get_backend(config), dynamic=True)
    x = torch.randn(4, 64)
    set_dim_gears(x, {0: [2, 4]})
    with torch.no_grad():
        for batch in (4, 2, 3):
            y = x[:batch].clone() if batch != 4 else x
            torch.testing.assert_close(fn(y), model(y), rtol=1e-4, atol=1e-5)
    assert len(lifted) == 3  # the two gears and the symbolic graph
    for shapes, inputs, constants in lifted:
        # 64x48 and 48x8 weights: only the first is above LIFT_NUMEL (1024); biases stay constants
        assert [tuple(s) for s in shapes] in ([(48, 64)], [(64, 48)]) and inputs == constants == 1


# -- real models at every gear -------------------------------------------------------------------

def test_minilm_real_weights_every_batch_gear_matches_eager_and_pads_between():
    model = models.minilm()
    config = rewrite.CompilerConfig()
    config.inference_config.gear_fallback = "pad"
    fn, backend = _compile(model, config)
    ids = models.token_batch(2, 8, vocab=30000)
    set_dim_gears(ids, {0: [1, 2, 4]})
    counters.clear()
    with torch.no_grad():
        for b in (2, 1, 4, 3):  # 3 is no gear: padded to 4
            inp = ids if b == 2 else models.token_batch(b, 8, vocab=30000, seed=b)
            out, ref = fn(inp), model(inp)
            torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(out.pooler_output, ref.pooler_output, rtol=1e-4, atol=1e-4)
    assert unique_graphs() == 1
    assert sorted(backend.report.graphs[0].gears) == [(1,), (2,), (4,)]


def test_gpt2_batch_and_sequence_gears_by_product_match_eager():
    model = models.gpt2()
    config = rewrite.CompilerConfig()
    config.inference_config.dynamic_gears_merge_policy = "product"
    fn, backend = _compile(model, config)
    ids = models.token_batch(2, 8)
    set_dim_gears(ids, {0: [1, 2], 1: [8, 16]})
    counters.clear()
    with torch.no_grad():
        for b, t in [(2, 8), (1, 8), (1, 16), (2, 16)]:
            inp = ids if (b, t) == (2, 8) else models.token_batch(b, t, seed=b * t)
            out, ref = fn(inp), model(inp)
            torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state, rtol=1e-4, atol=1e-4)
    assert unique_graphs() == 1
    assert len(backend.report.graphs[0].gears) == 4


@pytest.mark.parametrize("first", [1, 4])
@pytest.mark.parametrize("fallback", ["pad", "dynamic"])
def test_fallbacks_serve_gears_and_other_sizes_from_one_graph_whatever_the_first_call(fallback, first):
    # Issue 27: "the same for gear_fallback='pad' and 'dynamic'": BERT, gears [1, 2, 4], batch 3 between them.
    from rewrite import models

    model = models.bert()
    config = rewrite.CompilerConfig()
    config.inference_config.gear_fallback = fallback
    fn, _ = _compile(model, config)
    ids = models.token_batch(first, 16)
    set_dim_gears(ids, {0: [1, 2, 4]})
    counters.clear()
    with torch.no_grad():
        for b in [first, 1, 2, 3, 4]:
            x = ids if b == first else models.token_batch(b, 16, seed=b)
            torch.testing.assert_close(fn(x).last_hidden_state, model(x).last_hidden_state, rtol=1e-4, atol=1e-4)
    assert unique_graphs() == 1


# -- gear axes: dims that are one size, whichever inputs carry them --------------------------------

def test_product_makes_one_axis_of_the_same_dim_of_inputs_declared_alike():
    """A model's input_ids and attention_mask over batch and sequence: |B| x |L| gears, not (|B| x |L|)^2."""
    batch, seq = list(range(1, 6)), [16, 32, 64, 128, 256]
    ids = InputGears(0, "input_ids", {0: tuple(batch), 1: tuple(seq)}, (5, 256))
    mask = InputGears(1, "attention_mask", {0: tuple(batch), 1: tuple(seq)}, (5, 256))
    gears = merge_gears([ids, mask], "product")
    assert len(gears) == 25 and all(g[(0, 0)] == g[(1, 0)] and g[(0, 1)] == g[(1, 1)] for g in gears)
    # without the call's sizes (or with different ones) the declarations alone do not make one axis
    assert len(merge_gears([_inp(0, {0: [2, 4]}), _inp(1, {0: [2, 4]})], "product")) == 4
    # dims the trace made one size symbol are one axis whatever their declarations; they share their common sizes
    a, b = InputGears(0, "a", {0: (2, 4, 8)}, (8,)), InputGears(1, "b", {1: (4, 8)}, (3, 8))
    assert [g[(0, 0)] for g in merge_gears([a, b], "product", {(0, 0): "s0", (1, 1): "s0"})] == [4, 8]


class Rowwise(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2, x.shape[0] * 3


@pytest.mark.parametrize("strict", [False, True], ids=["counted", "strict"])
def test_fit_splits_sizes_beyond_the_largest_gear_and_counts_them(strict):
    model = Rowwise().eval()
    config = rewrite.CompilerConfig(strict=strict, **{"inference_config.gear_fallback": "fit"})
    fn, _ = _compile(model, config)
    x = torch.randn(8, 8)
    set_dim_gears(x, {0: [1, 2, 8]})
    with torch.no_grad():
        out, n = fn(x)
        torch.testing.assert_close(out, model(x)[0])
        big = torch.randn(11, 8)  # no gear holds 11 rows: 8 + 2 + 1
        if strict:
            with pytest.raises(rewrite.SlowPathError, match=r"split into several gears' runs: input x dim 0 = 11 ran "
                                                             r"as gears 8 \+ 2 \+ 1"):
                fn(big)
            return
        out, n = fn(big)
    torch.testing.assert_close(out, model(big)[0])
    assert n == 33
    stats = rewrite.stats(fn)
    assert stats.splits == 1 and stats.pads == 0 and stats.padded_rows == 0, stats


def test_fit_chooses_between_padding_and_splitting_by_the_measured_latency():
    from rewrite.gears.fit import plan_fit

    # 9 rows with gears [1, 8, 16]: one call of 8 and one of 1 beats 16 when calls cost little...
    assert plan_fit(9, [1, 8, 16], {1: 1.0, 8: 8.0, 16: 16.0}).parts == ((8, 8), (1, 1))
    # ...and padding to 16 wins when each call costs a lot more than its rows
    assert plan_fit(9, [1, 8, 16], {1: 10.0, 8: 12.0, 16: 14.0}).parts == ((9, 16),)
    # 37 with [1, 4, 8, 32]: 32 + 4 + 1 or 32 + 8 (3 padded), by price
    assert plan_fit(37, [1, 4, 8, 32], {1: 1.0, 4: 4.0, 8: 8.0, 32: 32.0}).parts == ((32, 32), (4, 4), (1, 1))
    assert plan_fit(37, [1, 4, 8, 32], {1: 3.0, 4: 5.0, 8: 6.0, 32: 20.0}).parts == ((32, 32), (5, 8))



def test_gears_are_priced_by_their_measurements_and_a_robust_line_through_them():
    from rewrite.gears.fit import predicted_seconds

    rows = lambda g: g[0]  # noqa: E731
    gears = [(1,), (2,), (4,), (8,), (16,)]
    # on a line (1 ms per call + 1 ms per row): the unmeasured gear is priced on it
    on_line = {(1,): 2.0, (2,): 3.0, (8,): 9.0, (16,): 17.0}
    assert predicted_seconds(gears, on_line, rows)[(4,)] == pytest.approx(5.0)
    # one slow measurement at either end moves the price little (a line through the two ends prices 4 rows at
    # 10.1 when 16 rows measured 40); measured gears keep their own figure
    seconds = predicted_seconds(gears, {**on_line, (16,): 40.0}, rows)
    assert seconds[(4,)] <= 7.0 and seconds[(16,)] == 40.0
    assert predicted_seconds(gears, {**on_line, (1,): 10.0}, rows)[(4,)] <= 7.5
    # never a negative fixed cost: through the origin instead
    assert predicted_seconds(gears, {(1,): 0.5, (16,): 20.0, (8,): 10.0}, rows)[(4,)] == pytest.approx(5.0)
    # a gear measured a few times only (GearLatency.unsettled) is priced at the lower of its figure and the line's
    from rewrite.gears.fit import GearLatency

    latency = GearLatency()
    for _ in range(3):  # the first two calls (warm-up) are not measured
        latency.record((4,), 0.03)
    assert latency.measured() == {(4,): 0.03} and latency.unsettled() == {(4,)}
    for _ in range(16):  # a full window of calls
        latency.record((4,), 0.02)
    assert latency.measured() == {(4,): 0.02} and latency.unsettled() == set()
    seconds = predicted_seconds(gears, {**on_line, (4,): 30.0}, rows, unsettled={(4,)})
    assert seconds[(4,)] == pytest.approx(5.0)
    assert predicted_seconds(gears, {**on_line, (4,): 30.0}, rows)[(4,)] == 30.0  # settled: its own figure
    assert predicted_seconds(gears, {**on_line, (4,): 3.0}, rows, unsettled={(4,)})[(4,)] == 3.0
    # one measurement: its fixed cost an eighth of its work; none: rows, with an eighth of the largest as fixed
    assert predicted_seconds(gears, {(8,): 9.0}, rows)[(16,)] == pytest.approx(1.0 + 16.0)
    assert predicted_seconds(gears, {}, rows)[(4,)] == pytest.approx(2.0 + 4.0)

    # the symbolic graph: twice the gears' line until it has measurements at two sizes, then a line through them
    line = lambda elements: 1.0 + elements  # noqa: E731
    latency = GearLatency()
    assert latency.dynamic_seconds(9, line) == pytest.approx(20.0)
    for elements, seconds in [(4, 99.0), (8, 99.0), (4, 4.0), (8, 6.0), (16, 10.0)]:  # the first two: warm-up
        latency.record_dynamic(elements, seconds)
    assert latency.dynamic_seconds(12, line) == pytest.approx(8.0)  # 2 + 0.5 per element


# -- the sequence proof: padded keys masked out, or refused ----------------------------------------------

def _sdpa(q, mask=None, causal=False):
    return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask, is_causal=causal)


def _key_mask(m):  # [b, s] of 1/0 -> [b, 1, s, s] bool, as transformers builds it from the attention mask
    return m.bool()[:, None, None, :].expand(m.shape[0], 1, m.shape[1], m.shape[1])


@pytest.mark.parametrize("fn", [
    lambda q, m: _sdpa(q, _key_mask(m)),                                                       # a bool key mask
    lambda q, m: _sdpa(q, (1.0 - m[:, None, None, :].float()) * torch.finfo(torch.float32).min),  # additive
    lambda q, m: _sdpa(q, torch.where(_key_mask(m), 0.0, float("-inf"))),                      # -inf where masked
    lambda q, m: _sdpa(q, causal=True) + m[:, None, :, None],                                  # causal: padding after
], ids=["bool", "additive-min", "where-inf", "causal"])
def test_sequence_proof_pads_where_every_padded_key_is_masked(fn):
    from rewrite.gears.padding import Row, row_states_and_mixing

    g = _symbolic(fn, (2, 3, 5, 4), (2, 5))
    s = g.placeholders[0].meta.shape[2]
    states, mixed = row_states_and_mixing(g, s)
    assert _out_state(g, states) == Row(2) and mixed  # pads, and says why it cannot split


@pytest.mark.parametrize("fn, reason", [
    (lambda q, m: _sdpa(q), "attends across the rows"),                                          # no mask at all
    (lambda q, m: _sdpa(q, m[:, None, None, :] * float("-inf")), "attends across the rows"),    # padded: 0 * -inf
    (lambda q, m: _sdpa(q, _key_mask(1 - m)), "attends across the rows"),                       # padded keys kept
    (lambda q, m: _sdpa(q, _key_mask(m)).mean(2), "reduces across the rows"),                   # pooled over the pad
    (lambda q, m: _sdpa(q, _key_mask(m)).flip(2), "not known to keep the rows"),                # reversed positions
], ids=["no-mask", "zero-times-inf", "inverted-mask", "mean-pool", "flip"])
def test_sequence_proof_refuses_what_reads_the_padding(fn, reason):
    from rewrite.gears.padding import NotRowwise, row_states

    g = _symbolic(fn, (2, 3, 5, 4), (2, 5))
    with pytest.raises(NotRowwise, match=reason):
        row_states(g, g.placeholders[0].meta.shape[2])


def test_masked_sum_pooling_pads_but_does_not_split():
    from rewrite.gears.padding import INDEP, row_states_and_mixing

    def pool(x, m):  # sentence-transformers' mean pooling: padded positions summed as zeros
        w = m[:, :, None].float()
        return (x * w).sum(1) / w.sum(1).clamp(min=1e-9)

    g = _symbolic(pool, (2, 5, 4), (2, 5))
    states, mixed = row_states_and_mixing(g, g.placeholders[0].meta.shape[1])
    assert _out_state(g, states) is INDEP and mixed
