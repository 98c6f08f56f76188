"""check_fx_pass on Inductor's own graph passes (torch 2.13): what it finds, pinned.

Inductor's joint-graph constant folding (``constant_fold_uniform_value``, run by every
``torch.compile`` with the default backend) has two unsound rewrites the checker finds on its
own, each confirmed end to end through ``torch.compile`` (see docs/testing.md):

* ``x * 0`` with an integer literal 0 becomes ``full(0.0)`` for float ``x`` (the "peephole
  pattern" of ``UniformValueConstantFolder``): wrong for NaN, +-inf (NaN) and negatives (-0.0);
* ``x + zeros`` becomes ``x`` (``remove_no_ops``): wrong for ``x = -0.0``, and when the sum is
  returned the compiled function returns its input itself, so writing to the result writes to
  the caller's input.

If a torch upgrade fixes them, these tests fail: turn them into checks that the pass is sound.
Post-grad ``remove_noop_ops`` and ``reorder_for_locality`` pass.
"""
from __future__ import annotations

import re

import pytest
import torch

from rewrite.testing import check_fx_pass

joint_graph = pytest.importorskip("torch._inductor.fx_passes.joint_graph")
post_grad = pytest.importorskip("torch._inductor.fx_passes.post_grad")

FLOAT = (torch.float32,)
# The graphs Inductor's passes see: its own decompositions (zeros_like -> full, ...).
INDUCTOR = dict(decompositions="inductor", dtypes=FLOAT, focus=False, shrink_seconds=8)


def _failure(pass_fn, **options) -> str:
    with pytest.raises(AssertionError) as err:
        check_fx_pass(pass_fn, **options)
    return str(err.value)


def test_finds_inductor_folding_float_x_times_int_zero_to_zero():
    message = _failure(joint_graph.constant_fold_uniform_value, examples=30, ops=["mul_scalar"], **INDUCTOR)
    assert re.search(r"expected (nan|-0\.0), got 0\.0", message), message
    before, after = message.split("graph after the pass (FX code):")
    assert "torch.ops.aten.mul.Tensor(arg0_1, 0)" in before
    # The int-zero multiply became a full(0.0); float-zero ones Inductor leaves may remain in a counterexample
    # whose shrinking stopped at its time budget (shrink_seconds) on a loaded machine.
    assert not re.search(r"aten\.mul\.Tensor\(arg0_1, 0\)", after) and "torch.ops.aten.full.default" in after


def test_finds_inductor_removing_x_plus_zeros_signed_zero_and_aliasing():
    fold = joint_graph.constant_fold_uniform_value
    # With the aliasing check: the sum is replaced by x, so a returned sum is the caller's input.
    message = _failure(fold, examples=30, ops=["zeros_like", "add"], **INDUCTOR)
    assert re.search(r"output \d is input arg\d_1 after the pass but was fresh memory before", message), message
    # Values only: x + 0.0 is +0.0 for x = -0.0, the pass returns -0.0.
    message = _failure(fold, examples=150, ops=["zeros_like", "add"], check_aliasing=False, **INDUCTOR)
    assert "expected 0.0, got -0.0" in message, message
    assert "torch.ops.aten.add.Tensor" in message.split("graph after the pass (FX code):")[0]


@pytest.mark.parametrize("pass_fn", [post_grad.remove_noop_ops, post_grad.reorder_for_locality])
def test_inductor_post_grad_graph_passes_are_sound_on_random_graphs(pass_fn):
    report = check_fx_pass(pass_fn, takes="graph", examples=30, decompositions="inductor", focus=False)
    assert report.changed > 0
