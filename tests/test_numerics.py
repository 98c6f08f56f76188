"""Results at the edges of a dtype's range: what eager computes there, rewrite computes too.

Written as a user calls: ``torch.compile(f, backend="rewrite")`` with default settings, called past
the default mode's tier-up, compared with eager on every output.
"""
from __future__ import annotations

import pytest
import torch

import rewrite


def _calls_past_tier_up() -> int:
    return rewrite.CompilerConfig().exec.tier_up_calls + 2


@pytest.mark.parametrize("kernels", ["aten", "inductor"])
def test_std_of_a_row_near_float_max_matches_eager(kernels):
    # sqrt(var) squares 3e38 into inf before the root; ATen's std takes the root in double precision.
    def spread(x):
        return (x.std(1, correction=0), x.std(1), torch.std_mean(x, 1), x.var(1), torch.var_mean(x, dim=1))

    x = torch.randn(3, 8)
    x[0, 3] = 3e38
    x[1, 2] = -3e38
    want = spread(x)
    assert torch.isfinite(want[0][:2]).all()  # the case this test is about
    if kernels == "aten":
        compiled = torch.compile(spread, backend="rewrite")
    else:
        config = rewrite.CompilerConfig()
        config.exec.kernels = "inductor"
        compiled = torch.compile(spread, backend=rewrite.get_backend(compiler_config=config))
    for _ in range(_calls_past_tier_up()):
        torch.testing.assert_close(compiled(x), want, equal_nan=True)


# Ops whose ATen forms (decompositions or kernels) could overflow or cancel at the edges of float32,
# each called on rows holding +-3e38 and denormals. Eager is the reference, whatever it gives there.
_EDGE_OPS = {
    "norm": lambda x: torch.norm(x, dim=1), "frobenius": lambda x: torch.norm(x),
    "vector_norm": lambda x: torch.linalg.vector_norm(x, dim=1), "logsumexp": lambda x: torch.logsumexp(x, 1),
    "logaddexp": lambda x: torch.logaddexp(x, x.flip(1)), "softplus": torch.nn.functional.softplus,
    "logsigmoid": torch.nn.functional.logsigmoid, "mish": torch.nn.functional.mish, "silu": torch.nn.functional.silu,
    "sinc": torch.sinc, "xlogy": lambda x: torch.xlogy(x, x.abs()), "hardswish": torch.nn.functional.hardswish,
    "cosine_similarity": lambda x: torch.nn.functional.cosine_similarity(x, x.flip(1), dim=1),
    "elu": torch.nn.functional.elu, "selu": torch.nn.functional.selu, "celu": torch.nn.functional.celu,
    "log_softmax": lambda x: torch.log_softmax(x, 1), "softmax": lambda x: torch.softmax(x, 1),
    "rms_norm": lambda x: torch.nn.functional.rms_norm(x, (8,)), "lerp": lambda x: torch.lerp(x, x.flip(1), 0.3),
    "addcdiv": lambda x: torch.addcdiv(x, x, x.flip(1) + 2, value=0.5), "mean": lambda x: x.mean(1),
    "pairwise_distance": lambda x: torch.nn.functional.pairwise_distance(x, x.flip(1)),
    "huber": lambda x: torch.nn.functional.huber_loss(x, x.flip(1), reduction="none"), "frac": torch.frac,
}
# The static kernels compute these in double where ATen's float32 kernel overflows (gelu's x^3, layer
# norm's variance): after the tier-up they give the finite answer, so they are compared before it only.
_EDGE_OPS_BEFORE_TIER_UP = {"gelu": torch.nn.functional.gelu,
                            "layer_norm": lambda x: torch.nn.functional.layer_norm(x, (8,))}


def _edge_rows() -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    x[0, 3], x[1, 2], x[2, 1], x[2, 5] = 3e38, -3e38, 1e-39, 3e-38
    return x


def test_ops_at_the_edges_of_float32_match_eager_past_the_tier_up():
    names = sorted(_EDGE_OPS)

    def edges(x):
        return [_EDGE_OPS[n](x) for n in names]

    x = _edge_rows()
    want = edges(x)
    compiled = torch.compile(edges, backend="rewrite")
    for _ in range(_calls_past_tier_up()):
        for name, got, w in zip(names, compiled(x), want):
            torch.testing.assert_close(got, w, equal_nan=True, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


def test_ops_whose_kernels_are_more_exact_match_eager_before_the_tier_up():
    names = sorted(_EDGE_OPS_BEFORE_TIER_UP)

    def edges(x):
        return [_EDGE_OPS_BEFORE_TIER_UP[n](x) for n in names]

    x = _edge_rows()
    config = rewrite.CompilerConfig()
    config.exec.tier_up_calls = 0
    compiled = torch.compile(edges, backend=rewrite.get_backend(compiler_config=config))
    for name, got, w in zip(names, compiled(x), edges(x)):
        torch.testing.assert_close(got, w, equal_nan=True, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
