"""Frozen weights (rewrite/frozen.py): on by default for inference graphs, and never stale: a call whose weights
changed since the compile gets the graph compiled again with their new values, counted, or an error under strict."""
from __future__ import annotations

import threading

import pytest
import torch

import rewrite


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()


def _compiled(model, **fields):
    backend = rewrite.get_backend(rewrite.CompilerConfig(**fields))
    return torch.compile(model, backend=backend, fullgraph=True), backend


def test_inference_weights_are_frozen_by_default():
    assert rewrite.CompilerConfig().experimental_config.frozen_parameter is True
    model = _model()
    served, backend = _compiled(model)
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(served(x), model(x))
    assert rewrite.stats(served).refreezes == 0


@pytest.mark.parametrize("change", ["in place", "load_state_dict", "data assignment", "new parameter"])
def test_a_changed_weight_compiles_the_graph_again_with_its_new_value(change):
    model = _model()
    served, _ = _compiled(model)
    x = torch.randn(3, 8)
    calls = rewrite.CompilerConfig().exec.tier_up_calls + 2  # past the tier-up: the static plan runs too
    with torch.no_grad():
        for _ in range(calls):
            served(x)
        if change == "in place":
            model[0].weight.mul_(2)
        elif change == "load_state_dict":
            model.load_state_dict({k: torch.randn_like(v) for k, v in model.state_dict().items()})
        elif change == "data assignment":
            model[2].weight.data = torch.randn(4, 16)
        else:
            model[2].bias = torch.nn.Parameter(torch.randn(4))
        for _ in range(calls):
            torch.testing.assert_close(served(x), model(x))
    stats = rewrite.stats(served)
    assert stats.refreezes == 1, stats
    assert "frozen weight(s) changed" in str(stats)


def test_unfrozen_graphs_follow_their_weights_without_recompiling():
    model = _model()
    served, _ = _compiled(model, **{"experimental_config.frozen_parameter": False})
    x = torch.randn(3, 8)
    with torch.no_grad():
        served(x)
        model[0].weight.mul_(2)
        torch.testing.assert_close(served(x), model(x))
    assert rewrite.stats(served).refreezes == 0


def test_training_graphs_are_not_frozen():
    """Weights that need grad, called with grad on: forward/backward graphs, whose weights stay inputs."""
    model = torch.nn.Linear(8, 4)
    served, _ = _compiled(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 8)
    for _ in range(3):
        opt.zero_grad()
        served(x).sum().backward()
        opt.step()
    torch.testing.assert_close(served(x), model(x))
    assert rewrite.stats(served).refreezes == 0


def test_strict_refuses_to_run_with_changed_frozen_weights():
    model = _model()
    served, _ = _compiled(model, strict=True)
    x = torch.randn(3, 8)
    with torch.no_grad():
        served(x)
        model[0].weight.add_(1)
        with pytest.raises(rewrite.SlowPathError, match="frozen weight.*changed.*frozen_parameter = False"):
            served(x)


def test_threads_that_see_a_change_at_once_compile_it_once():
    model = _model()
    served, _ = _compiled(model)
    x = torch.randn(3, 8)
    with torch.no_grad():
        served(x)
        model[0].weight.mul_(3)
        want = model(x)
    results, errors = [], []

    def call():
        try:
            with torch.no_grad():
                results.append(served(x))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for got in results:
        torch.testing.assert_close(got, want)
    assert rewrite.stats(served).refreezes == 1
