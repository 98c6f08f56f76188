"""Results at the edges of a dtype's range: what eager computes there, rewrite computes too.

Written as a user calls: ``torch.compile(f, backend="rewrite")`` with default settings, called past
the default mode's tier-up, compared with eager on every output.
"""
from __future__ import annotations

import torch

import rewrite


def _calls_past_tier_up() -> int:
    return rewrite.CompilerConfig().exec.tier_up_calls + 2


def test_std_of_a_row_near_float_max_matches_eager():
    # sqrt(var) squares 3e38 into inf before the root; ATen's std takes the root in double precision.
    def spread(x):
        return (x.std(1, correction=0), x.std(1), torch.std_mean(x, 1), x.var(1), torch.var_mean(x, dim=1))

    x = torch.randn(3, 8)
    x[0, 3] = 3e38
    x[1, 2] = -3e38
    want = spread(x)
    assert torch.isfinite(want[0][:2]).all()  # the case this test is about
    compiled = torch.compile(spread, backend="rewrite")
    for _ in range(_calls_past_tier_up()):
        torch.testing.assert_close(compiled(x), want, equal_nan=True)
