"""TorchAir's gear tests (tests/st/torchair_gear_st.py), ported. TorchAir raises AssertionError with
its own texts; rewrite raises `GearError`, which is both a ValueError and an AssertionError, with texts
that name the tensor, the dim and what is allowed. TorchAir's merge tests call a private GE option
builder; these call `rewrite.gears.spec.merge_gears` (the sets of gears, not their order).
"""
from __future__ import annotations

import pytest
import torch

import rewrite
import rewrite.compat.torchair as torchair
from rewrite.gears.spec import GearError, InputGears, merge_gears


def test_set_dim_gears_twice():
    """mirrors torchair_gear_st.py::test_set_dim_gears_twice: the same dict again is fine; any other
    dict (here: an added dim) is refused. Regression (issue 15): rewrite merged the new dim silently."""
    x = torch.ones([2, 2])
    torchair.inference.set_dim_gears(x, {1: [1, 2]})
    torchair.inference.set_dim_gears(x, {1: [1, 2]})
    with pytest.raises(AssertionError, match="already has gears"):
        torchair.inference.set_dim_gears(x, {0: [1, 2], 1: [1, 2]})
    with pytest.raises(GearError, match=r"already has gears \{1: \[1, 2\]\}.*different gears \{1: \[2, 4\]\}"):
        torchair.inference.set_dim_gears(x, {1: [2, 4]})


@pytest.mark.parametrize("dim_gears, match", [
    ({0.3: [1, 2]}, "dim 0.3 must be an int"),                           # test_set_dim_gears_dim_index_not_it
    ({0: 1}, "must be a non-empty list of positive ints"),                # test_set_dim_gears_value_not_list_or_tuple
    ({0: [1, 2], 2: [1, 2]}, "dim 2 is out of range"),                    # test_set_dim_gears_dim_index_out_of_range
    ({0: [1, 1.5]}, "gear value 1.5 of dim 0 is not allowed"),            # test_set_dim_gears_value_not_int
    ({0: list(range(1, 102))}, "101 distinct gears; at most 100"),        # test_set_dim_gears_value_lens_out_of_range
    ({0: [0, 2]}, "gear value 0 of dim 0 is not allowed"),                # test_set_dim_gears_value
])
def test_set_dim_gears_rejects(dim_gears, match):
    """mirrors torchair_gear_st.py::test_set_dim_gears_dim_index_not_it, _value_not_list_or_tuple,
    _dim_index_out_of_range, _value_not_int, _value_lens_out_of_range, _value (AssertionError there)."""
    with pytest.raises(AssertionError, match=match):
        torchair.inference.set_dim_gears(torch.ones([2, 2]), dim_gears)


def test_not_parse_stack_over():
    """mirrors torchair_gear_st.py::test_not_parse_stack_over: 98 gears (1 included) on one dim."""
    y = torch.ones([8, 8, 8])
    torchair.inference.set_dim_gears(y, {0: list(range(1, 99))})
    compiled = torch.compile(lambda t: t * 2, backend=torchair.get_npu_backend(), dynamic=True)
    torch.testing.assert_close(compiled(y), y * 2)


def test_guard_gears():
    """mirrors torchair_gear_st.py::test_guard_gears: the second gear runs the graph already compiled."""
    backend = torchair.get_npu_backend()
    compiled = torch.compile(lambda t: t * 2 + 1, backend=backend, dynamic=True)
    x = torch.ones([8, 8])
    torchair.inference.set_dim_gears(x, {0: [8, 4]})
    compiled(x)
    with torch._dynamo.config.patch(error_on_recompile=True):
        y = torch.randn([4, 8])
        torch.testing.assert_close(compiled(y), y * 2 + 1)
    assert len(backend.report.graphs) == 1


def _gears(policy, *dims_per_input) -> set:
    inputs = [InputGears(i, f"arg{i}", {d: tuple(v) for d, v in dims.items()}, ()) for i, dims in enumerate(dims_per_input)]
    return {tuple(sorted(g.items())) for g in merge_gears(inputs, policy)}


def test_config_product():
    """mirrors torchair_gear_st.py::test_config_product"""
    assert _gears("product", {0: [8, 4], 1: [8, 12]}) == {
        (((0, 0), a), ((0, 1), b)) for a, b in [(8, 8), (8, 12), (4, 8), (4, 12)]}


def test_config_zip():
    """mirrors torchair_gear_st.py::test_config_zip"""
    assert _gears("zip", {0: [8, 4]}) == {(((0, 0), 8),), (((0, 0), 4),)}


def test_config_zip_list_lens_same():
    """mirrors torchair_gear_st.py::test_config_zip_list_lens_same: zip needs equal lengths."""
    with pytest.raises(AssertionError, match="same number of gears"):
        _gears("zip", {0: [8, 4]}, {0: [8, 4, 3]})


def test_config_repeat():
    """mirrors torchair_gear_st.py::test_config_repeat: repeats inside a list are allowed (zip pairs)."""
    got = _gears("zip", {0: [1, 2, 4, 1, 2, 4], 1: [10, 10, 10, 20, 20, 20]})
    assert got == {(((0, 0), a), ((0, 1), b)) for a in (1, 2, 4) for b in (10, 20)}


def test_gears_num_not_over_100():
    """mirrors torchair_gear_st.py::test_gears_num_not_over_100: 9 x 10 x 10 = 900 > 100."""
    with pytest.raises(AssertionError, match="900 gears declared.*at most 100"):
        _gears("product", {0: list(range(1, 10))}, {0: list(range(1, 11))}, {0: list(range(11, 21))})


def test_gears_deduplicated():
    """mirrors torchair_gear_st.py::test_gears_deduplicated (as a set: TorchAir's order is set order)."""
    assert _gears("product", {0: [1, 2]}, {0: [10, 11, 10, 11]}) == {
        (((0, 0), a), ((1, 0), b)) for a in (1, 2) for b in (10, 11)}


def test_merge_policy_from_config():
    """the merge policy is read from config.inference_config (TorchAir's option), end to end."""
    config = torchair.CompilerConfig()
    config.inference_config.dynamic_gears_merge_policy = "product"
    backend = torchair.get_npu_backend(compiler_config=config)
    compiled = torch.compile(lambda a, b: a.sum(1) + b.sum(), backend=backend, dynamic=True)
    a, b = torch.randn(4, 3), torch.randn(2, 5)
    torchair.inference.set_dim_gears(a, {0: [2, 4]})
    torchair.inference.set_dim_gears(b, {0: [2, 3]})
    torch.testing.assert_close(compiled(a, b), a.sum(1) + b.sum())
    with torch._dynamo.config.patch(error_on_recompile=True):
        for rows_a, rows_b in [(2, 3), (4, 2)]:
            a, b = torch.randn(rows_a, 3), torch.randn(rows_b, 5)
            torch.testing.assert_close(compiled(a, b), a.sum(1) + b.sum())
    assert rewrite.CompilerConfig().inference_config.dynamic_gears_merge_policy == "zip"


@pytest.mark.skip(reason="NPU-only: drives the GE executor (TorchNpuGraph) with ge.dynamicDims options")
def test_muti_gear_npu_executor_pre_assigned_outputs():
    """mirrors torchair_gear_st.py::test_muti_gear_npu_executor_pre_assigned_outputs and
    test_muti_gear_npu_executor_muti_output"""
