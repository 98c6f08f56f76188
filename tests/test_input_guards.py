"""Calls without the model's guards (rewrite.inference.input_guards, issue 44): Dynamo keeps checking the
call's inputs and the global state and drops its guards on the model. One test per kept check: a call failing
it gets a graph of its own (a retrace, counted; strict mode raises naming the check), never the graph of
other inputs."""
from __future__ import annotations

import pytest
import torch

import rewrite
from rewrite.input_guards import STATE_GUARDS

from conftest import tiny_llama


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.scale = 2.0  # a plain attribute: its guard is dropped

    def forward(self, x, shift: float = 0.0, mask=None):
        y = self.norm(torch.relu(self.lin(x)) * self.scale + shift)
        return y if mask is None else y * mask


def _compiled(model, spy=None, strict=False, **config_fields):
    config = rewrite.CompilerConfig(strict=strict, **config_fields)
    filter_fn = rewrite.inference.input_guards if spy is None else spy
    return torch.compile(model, backend=rewrite.get_backend(config), fullgraph=True, dynamic=False,
                         options={"guard_filter_fn": filter_fn})


def test_only_guards_on_the_inputs_and_the_global_state_are_kept():
    decisions = []

    def spy(entries):
        keep = rewrite.inference.input_guards(entries)
        decisions.extend(zip(entries, keep))
        return keep

    model = _Block().eval()
    compiled = _compiled(model, spy)
    with torch.no_grad():
        compiled(torch.randn(4, 8), 0.5)
    kept = [e for e, k in decisions if k]
    dropped = [e for e, k in decisions if not k]
    assert len(dropped) > len(kept) and any(isinstance(e.value, torch.nn.Parameter) for e in dropped)
    assert any(e.guard_type == "TENSOR_MATCH" and e.name == "x" for e in kept), [e.name for e in kept]
    for e in kept:  # the inputs (x, shift, mask) or the global state; nothing of the model
        assert e.guard_type in STATE_GUARDS or e.name.split("[")[0].split(".")[0] in ("x", "shift", "mask"), \
            (e.guard_type, e.name)


# (what changes, the call's arguments, words of Dynamo's reason naming the failed check)
KEPT_CHECKS = [
    ("rank", lambda: (torch.randn(1, 4, 8), 0.5), "x"),
    ("static size", lambda: (torch.randn(5, 8), 0.5), "size mismatch"),
    ("requires_grad", lambda: (torch.randn(4, 8, requires_grad=True), 0.5), "requires_grad"),
    ("other argument", lambda: (torch.randn(4, 8), 0.75), "shift"),
    ("argument's type", lambda: (torch.randn(4, 8), 0.5, torch.ones(4, 8)), "mask"),
]


def _retraced_once_and_strict_raises(make, first, other, reason):
    """``make()`` -> (eager function, compiled with input_guards (strict=...)): a call with ``other()`` after
    ``first`` gets its own graph (eager's values, one retrace naming ``reason``); strict mode raises on it."""
    model, compiled = make(False)
    with torch.no_grad():
        compiled(*first)
        call = other()
        torch.testing.assert_close(compiled(*call), model(*call))
    stats = rewrite.stats(compiled)
    assert stats.recompiles == 1 and reason in stats.events[0][1], stats.events
    torch._dynamo.reset()
    _, strict = make(True)
    with torch.no_grad():
        strict(*first)
        with pytest.raises(rewrite.SlowPathError, match=reason):
            strict(*other())


@pytest.mark.parametrize("change, other, reason", KEPT_CHECKS, ids=[c[0] for c in KEPT_CHECKS])
def test_a_call_failing_a_kept_check_gets_its_own_graph_and_strict_mode_names_the_check(change, other, reason):
    def make(strict):
        model = _Block().eval()
        return model, _compiled(model, strict=strict)

    _retraced_once_and_strict_raises(make, (torch.randn(4, 8), 0.5), other, reason)


def _weightless(x):
    return torch.relu(x) * 2


def test_the_dtype_is_a_kept_check():
    _retraced_once_and_strict_raises(lambda strict: (_weightless, _compiled(_weightless, strict=strict)),
                                     (torch.randn(4, 8),), lambda: (torch.randn(4, 8, dtype=torch.float64),), "dtype")


def test_the_device_is_a_kept_check():
    _retraced_once_and_strict_raises(lambda strict: (_weightless, _compiled(_weightless, strict=strict)),
                                     (torch.randn(4, 8),), lambda: (torch.randn(4, 8, device="meta"),), "Meta")


def test_the_grad_mode_is_a_kept_check():
    model = _Block().eval()
    compiled = _compiled(model)
    x = torch.randn(4, 8)
    with torch.no_grad():
        compiled(x, 0.5)
    with torch.enable_grad():
        y = compiled(x.requires_grad_(), 0.5)
    assert y.requires_grad  # a training graph of its own, not the inference graph
    assert rewrite.stats(compiled).recompiles == 1


def test_gears_are_checked_by_the_dispatch_and_serve_without_a_retrace():
    model = _Block().eval()
    compiled = _compiled(model, **{"inference_config.gear_fallback": "error"})
    x = torch.randn(4, 8)
    rewrite.inference.set_dim_gears(x, {0: [2, 4]})
    with torch.no_grad():
        compiled(x, 0.5)
        for rows in (4, 2, 4):
            y = torch.randn(rows, 8)
            torch.testing.assert_close(compiled(y, 0.5), model(y, 0.5))
        with pytest.raises(rewrite.GearError, match="gear"):
            compiled(torch.randn(3, 8), 0.5)
    assert rewrite.stats(compiled).recompiles == 0 and rewrite.stats(compiled).gears == {(4,): 3, (2,): 1}


def test_the_model_is_taken_as_it_was_at_the_first_call():
    """The promise a user makes by opting in: the model's attributes do not change (not checked per call)."""
    model = _Block().eval()
    compiled = _compiled(model)
    x = torch.randn(4, 8)
    with torch.no_grad():
        want = model(x, 0.5)
        compiled(x, 0.5)
        model.scale = 3.0
        torch.testing.assert_close(compiled(x, 0.5), want)  # the first call's graph, no retrace
    assert rewrite.stats(compiled).recompiles == 0


@pytest.mark.parametrize("door", ["module", "__call__"])  # "__call__": what transformers' generate compiles
def test_two_models_of_one_class_sharing_a_backend_each_get_their_own_graph(door):
    """Dropping the model's guards must not let one model's call run another's graph (two fine-tunes served in one
    process): their weights differ, and each must compute with its own."""
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        models.append(_Block().eval())
    backend = rewrite.get_backend()
    compiled = [torch.compile(m if door == "module" else m.__call__, backend=backend, fullgraph=True, dynamic=False,
                              options={"guard_filter_fn": rewrite.inference.input_guards}) for m in models]
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(2):
            for m, c in zip(models, compiled):
                torch.testing.assert_close(c(x, 0.5), m(x, 0.5))
        assert not torch.allclose(models[0](x, 0.5), models[1](x, 0.5))  # the check above can tell them apart


def test_an_object_argument_such_as_a_kv_cache_keeps_its_tensor_checks():
    """An object argument (a KV cache) is an input: another cache of the same shape is read where it is,
    a longer one gets its own graph."""
    class Cache:
        def __init__(self, length):
            self.keys = torch.randn(length, 8)

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x, cache):
            return self.lin(x) + cache.keys.sum(0)

    model = Step().eval()
    compiled = _compiled(model)
    x = torch.randn(1, 8)
    with torch.no_grad():
        for cache in (Cache(16), Cache(16), Cache(32)):
            torch.testing.assert_close(compiled(x, cache), model(x, cache))
    assert rewrite.stats(compiled).recompiles == 1 and "keys" in rewrite.stats(compiled).events[0][1]


def test_transformers_door_with_input_guards_decodes_eagers_tokens():
    """transformers' own door for a backend, with the model's guards dropped: the static-cache decode's step graph
    serves every step, with eager's tokens and no retrace; a backend object in CompileConfig survives transformers'
    deep copies of its generation config."""
    from transformers import CompileConfig

    model, ids = tiny_llama()

    def generate(**kw):
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False,
                                  cache_implementation="static", **kw)

    want = generate(disable_compile=True)
    backend = rewrite.get_backend()
    # torch.compile takes a mode or options, not both: the mode is the backend's config's, CompileConfig's is None
    door = CompileConfig(backend=backend, mode=None, options={"guard_filter_fn": rewrite.inference.input_guards})
    door._compile_all_devices = True  # transformers compiles by itself only on accelerators; this is its switch
    model.generation_config.compile_config = door
    for _ in range(2):
        assert torch.equal(generate(), want)
    # transformers compiles the one-token decoding step (the prefill runs as it is): one graph, never traced again
    assert len(backend.report.graphs) == 1, [g.name for g in backend.report.graphs]
    assert backend.ledger.stats().recompiles == 0
