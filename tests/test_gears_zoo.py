"""The gear planner, declared shapes, the memory bound, the ledger and strict mode on the model zoo's encoder
(bert) and decoder (gpt2): tiny `transformers` models with random weights (tests/zoo), called with the zoo's
inputs, every call compared with eager. The same features on toy models: test_gear_planner.py,
test_declared_shapes.py, test_gear_memory.py, test_slow_paths.py.

Padding needs a proof that rows stay independent (rewrite.gears.padding). The zoo's attention masks are read
through ``mask[batch_arange[:, None, None, None], kv_arange]`` (transformers' mask functions), an
``aten.index.Tensor`` the proof covers when the mask's rows are indexed by the row numbers themselves
(``batch_arange`` is ``arange`` of the batch). gpt2 ties the batch of input_ids and attention_mask into one
symbol, so its sizes between gears pad. bert does not (its mask is only indexed, never broadcast against the
ids): the two inputs' batch dims are two symbols, and padding the mask's symbol alone is not provable (its rows are
read by the row numbers of the other symbol): the two are one gear axis (equal in every gear), proven row-wise
together (`rewrite.gears.padding.plan_padding`) and padded together (`test_the_encoder_pads_with_its_attention_mask`).
"""
from __future__ import annotations

import collections
import logging
import os
import subprocess
import sys

import pytest
import torch

import rewrite
from rewrite.cost import calibration
from rewrite.gears import GearError, evaluate_gears, plan_gears, recording
from rewrite.torch_compat import shapes_spec_keyword

from zoo import BY_NAME

try:
    from torch.fx.experimental.dynamic_spec import ParamsSpec, ShapeVar, TensorSpec
except ImportError:  # torch 2.11 (the GPU machines) has no shapes_spec
    ShapeVar = None

ENCODER, DECODER = BY_NAME["bert"], BY_NAME["gpt2"]
TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def bert():
    import transformers

    transformers.logging.set_verbosity_error()
    return ENCODER.model()


@pytest.fixture(scope="module")
def gpt2():
    return DECODER.model()


def ids(batch: int, seed: int) -> dict:
    """bert's inputs without the attention mask (optional): padding is provable on them."""
    return {"input_ids": ENCODER.inputs(batch, seed)["input_ids"]}


def _main(out) -> torch.Tensor:
    return out.last_hidden_state if "last_hidden_state" in out else out.logits


def check(compiled, model, inputs: dict) -> None:
    """One call of ``compiled`` matches eager on the model's main output."""
    with torch.no_grad():
        got, want = compiled(**inputs), model(**inputs)
    torch.testing.assert_close(_main(got), _main(want), **TOL)


def gears_on(inputs: dict, gears: list) -> dict:
    for t in inputs.values():
        rewrite.inference.set_dim_gears(t, {0: list(gears)})
    return inputs


def compile_with(model, strict: bool = False, shapes_spec=None, **fields):
    config = rewrite.CompilerConfig(**fields)
    config.strict = strict
    backend = rewrite.get_backend(config)
    extra = {} if shapes_spec is None else {shapes_spec_keyword(): shapes_spec}  # torch 2.13's name, or 2.14's
    return torch.compile(model, backend=backend, fullgraph=True, **extra), backend


def compiled_gears(backend) -> list:
    """The gears the backend compiled, from its report."""
    return sorted(g for r in backend.report.graphs for g in r.gears)


# -- 1. traffic to gears -------------------------------------------------------------------------------------

ENCODER_TRAFFIC = [2, 2, 2, 3, 4, 5, 5, 6, 8]


def test_encoder_traffic_is_recorded_planned_and_served_by_padding_to_the_planned_gears(bert):
    compiled = torch.compile(bert, backend="rewrite")
    first = ids(2, 99)
    torch._dynamo.mark_dynamic(first["input_ids"], 0)  # one symbolic graph records every batch size
    with torch.no_grad():
        compiled(**first)  # compiles outside the recording
        with recording() as rec:
            for k, b in enumerate(ENCODER_TRAFFIC):
                compiled(**ids(b, k))
    (stream, hist), = rec.streams.items()
    assert stream.function.startswith("BertModel.forward") and stream.dim == "input input_ids dim 0", stream
    assert hist == dict(collections.Counter(ENCODER_TRAFFIC))

    plan = plan_gears(rec, max_gears=3)
    # [2, 5, 8] runs 3*2 + 4*5 + 2*8 = 42 rows for the 37 asked: 5 padded (3 -> 5, 4 -> 5, 6 -> 8); the
    # runner-up [3, 5, 8] runs 43
    assert plan.gears == [2, 5, 8] and plan.stream == str(stream)
    assert plan.expected_waste == pytest.approx(5 / 42) and plan.padded_rows == pytest.approx(5 / 42)
    same = evaluate_gears(ENCODER_TRAFFIC, plan.gears)
    assert (same.expected_waste, same.padded_rows) == pytest.approx((plan.expected_waste, plan.padded_rows))
    assert plan.ladder == [1, 2, 4, 8] and plan.ladder_waste == pytest.approx(9 / 46)  # 3 -> 4, 5 -> 8 (x2), 6 -> 8

    torch._dynamo.reset()
    served, _ = compile_with(bert, **{"inference_config.gear_fallback": "pad"})
    check(served, bert, gears_on(ids(8, 100), plan.gears))
    for k, b in enumerate(ENCODER_TRAFFIC):
        check(served, bert, ids(b, 200 + k))
    stats = rewrite.stats(served)
    # the ledger counts what the plan predicted: 3 calls padded, by 5 rows in all (5/42 of the rows run)
    assert (stats.pads, stats.padded_rows) == (3, 5), stats
    assert stats.gears == {(8,): 2, (2,): 3, (5,): 2}, stats  # the padded calls are counted as pads
    assert stats.dynamic_fallbacks == stats.recompiles == 0, stats


DECODER_TRAFFIC = [2, 2, 2, 3, 3, 4, 6, 6, 8]


def test_decoder_traffic_is_recorded_on_every_batch_input_planned_and_served_as_declared_gears(gpt2, caplog):
    """gpt2's graph ties the batch dims of input_ids and attention_mask into one symbol, which Dynamo names after
    attention_mask; input_ids dim 0 took the same sizes and is recorded too (it was not: a stream named
    "input_ids dim 0" held nothing, or under dynamic=True only the calls of the graph specialized to batch 1)."""
    compiled = torch.compile(gpt2, backend="rewrite")
    first = DECODER.inputs(2, 99)
    for t in first.values():
        torch._dynamo.mark_dynamic(t, 0)
    with torch.no_grad():
        compiled(**first)
        with recording() as rec:
            for k, b in enumerate(DECODER_TRAFFIC):
                compiled(**DECODER.inputs(b, k))
    want = dict(collections.Counter(DECODER_TRAFFIC))
    assert rec.histogram("input_ids dim 0") == want and rec.histogram("attention_mask dim 0") == want, rec
    assert len(rec.streams) == 2 and rewrite.stats(compiled).recompiles == 0, rec

    plan = plan_gears(rec, max_gears=3)  # both streams are the same traffic: no stream= needed
    assert plan_gears(rec, max_gears=3, stream="input_ids dim 0").gears == plan.gears
    # [3, 6, 8] runs 5*3 + 3*6 + 8 = 41 rows for the 36 asked; the ladder's [2, 4, 8] runs 42 (the runner-up)
    assert plan.gears == [3, 6, 8] and plan.expected_waste == pytest.approx(5 / 41)
    assert plan.ladder == [1, 2, 4, 8] and plan.ladder_waste == pytest.approx(6 / 42)
    assert evaluate_gears(DECODER_TRAFFIC, plan.gears).expected_waste == pytest.approx(plan.expected_waste)

    # served as declared gears: mark_dynamic(min=, max=) on every batch input with the plan's gears in the config
    torch._dynamo.reset()
    caplog.set_level(logging.INFO, logger="rewrite")
    served, backend = compile_with(gpt2, **{"inference_config.declared_gears": plan.gears})
    first = DECODER.inputs(8, 100)
    for t in first.values():
        torch._dynamo.mark_dynamic(t, 0, min=2, max=8)
    check(served, gpt2, first)
    for k, b in enumerate(DECODER_TRAFFIC):
        check(served, gpt2, DECODER.inputs(b, 200 + k))
    assert compiled_gears(backend) == [(3,), (6,), (8,)]  # one batch symbol: the gears, not their product
    stats = rewrite.stats(served)
    assert stats.gears == {(8,): 2, (3,): 2, (6,): 2}, stats
    # 2, 2, 2 pad to 3 and 4 to 6 (the causal mask's index by the row numbers is proven row-wise)
    assert (stats.dynamic_fallbacks, stats.pads, stats.padded_rows, stats.recompiles) == (0, 4, 5, 0), stats


def test_the_encoder_pads_with_its_attention_mask(bert):
    """bert's two batch symbols (ids, mask) are one gear axis: proven row-wise together and padded together."""
    served, _ = compile_with(bert, **{"inference_config.gear_fallback": "pad"})
    check(served, bert, gears_on(ENCODER.inputs(4, 0), [4]))
    check(served, bert, ENCODER.inputs(3, 1))
    stats = rewrite.stats(served)
    assert (stats.pads, stats.padded_rows) == (1, 1), stats  # one row of the one batch axis, not one per input


def test_the_encoder_gets_batch_by_sequence_gears_and_splits_what_no_gear_holds(bert):
    """set_dim_gears on input_ids and attention_mask, batch x sequence by "product": |B| x |L| gears (not their
    square); gear_fallback="fit" pads or splits the batch, with outputs equal to eager at every real row."""
    served, backend = compile_with(bert, **{"inference_config.dynamic_gears_merge_policy": "product",
                                           "inference_config.gear_fallback": "fit"})
    first = ENCODER.inputs(4, 0)
    for t in first.values():
        rewrite.inference.set_dim_gears(t, {0: [1, 2, 4], 1: [4, 8]})
    check(served, bert, first)
    keys = compiled_gears(backend)
    assert len(keys) == 6 and {(b, s) for b, s, _ in keys} == {(b, s) for b in (1, 2, 4) for s in (4, 8)}, keys
    short = {k: v[:, :4] for k, v in ENCODER.inputs(2, 1).items()}
    check(served, bert, short)  # a gear (2, 4)
    check(served, bert, ENCODER.inputs(3, 2))  # between gears: padded to 4 or split 2 + 1
    check(served, bert, ENCODER.inputs(7, 3))  # beyond the largest gear: only a split serves it (4 + 2 + 1)
    stats = rewrite.stats(served)
    assert stats.splits >= 1 and stats.pads + stats.splits == 2 and stats.dynamic_fallbacks == 0, stats


# -- 2. declared shapes --------------------------------------------------------------------------------------

def test_a_declared_range_on_the_encoder_is_served_by_gears_padding_between_them(bert):
    compiled, backend = compile_with(bert)
    first = ids(8, 0)
    torch._dynamo.mark_dynamic(first["input_ids"], 0, min=2, max=8)
    check(compiled, bert, first)
    for b in (2, 4, 8, 3, 5, 6, 7):
        check(compiled, bert, ids(b, b))
    assert compiled_gears(backend) == [(2,), (4,), (8,)]  # the default ladder of [2, 8], not one dynamic graph
    stats = rewrite.stats(compiled)
    assert stats.gears == {(8,): 2, (2,): 1, (4,): 1}, stats
    assert (stats.pads, stats.padded_rows, stats.recompiles) == (4, 1 + 3 + 2 + 1, 0), stats  # 3->4, 5/6/7->8
    # outside the range Dynamo's guard of it fails: another graph, counted (strict mode: the next test)
    check(compiled, bert, ids(9, 9))
    stats = rewrite.stats(compiled)
    assert stats.recompiles == 1 and "2 <= kwargs['input_ids'].size()[0] <= 8" in stats.events[-1][1], stats


def test_strict_refuses_a_size_outside_the_declared_range_naming_it(bert):
    strict, _ = compile_with(bert, strict=True)
    first = ids(8, 0)
    torch._dynamo.mark_dynamic(first["input_ids"], 0, min=2, max=8)
    check(strict, bert, first)
    check(strict, bert, ids(4, 4))  # a gear: no slow path
    with pytest.raises(rewrite.SlowPathError, match=r"retrace.*guard `2 <= kwargs\['input_ids'\]\.size\(\)\[0\] <= 8` "
                                                     r"failed.*Fix: declare the sizes"), torch.no_grad():
        strict(**ids(9, 9))
    assert rewrite.stats(strict).recompiles == 0


@pytest.mark.skipif(ShapeVar is None, reason="this torch has no torch.compile(shapes_spec=...)")
def test_a_shape_var_on_the_encoder_gets_gears_pads_between_them_and_refuses_a_size_outside(bert):
    """Regression: a ShapeVar's graph asserts its range (aten._assert_scalar on u0), which the padding proof did
    not know: every size between gears ran the dynamic graph. transformers' forward is a ``(*args, **kwargs)``
    wrapper, so the spec names the input under ``**kwargs``."""
    batch = ShapeVar("B", min=1, max=8, optimization_hint=4)
    compiled, backend = compile_with(bert, shapes_spec=ParamsSpec({"**kwargs": {"input_ids": TensorSpec([batch, None])}}))
    for b in (4, 1, 2, 8, 3, 5):
        check(compiled, bert, ids(b, b))
    assert compiled_gears(backend) == [(1,), (2,), (4,), (8,)]  # the range's ends, the hint, the powers of two between
    stats = rewrite.stats(compiled)
    assert stats.gears == {(4,): 1, (1,): 1, (2,): 1, (8,): 1}, stats
    assert (stats.pads, stats.padded_rows, stats.dynamic_fallbacks, stats.recompiles) == (2, 1 + 3, 0, 0), stats
    with pytest.raises(rewrite.gears.OutsideDeclaredRange, match=r"input_ids dim 0 has size 9, outside the range "
                                                                  r"ShapeVar 'B' declares \[1, 8\]"), torch.no_grad():
        compiled(**ids(9, 9))  # refused naming the ShapeVar (Dynamo's own guard would fail on its new trace)


# -- 3. the memory bound -------------------------------------------------------------------------------------

def _memory(model, gears: list, first: int):
    inputs = DECODER.inputs(first, 0)
    if len(gears) > 1:
        gears_on(inputs, gears)
    # the fitted rates alone, no kernels timed: extraction's choices (a merged QKV or not, which sizes the arena's
    # buffers) then do not hang on timings taken on a loaded machine or after the process's measuring budget ran out
    with torch.no_grad(), calibration.use(calibration.DEFAULT):
        report = rewrite.explain(model, config=rewrite.CompilerConfig(mode="reduce-overhead"), **inputs)
        want = model(**DECODER.inputs(first, 0))
    torch.testing.assert_close(_main(report.result), _main(want), **TOL)
    (memory,) = [g.memory for g in report.graphs if g.memory is not None]
    return memory, report


def test_all_decoder_gears_take_about_the_memory_of_the_largest_alone(gpt2):
    every, report = _memory(gpt2, [1, 2, 4], first=2)
    torch._dynamo.reset()
    alone, _ = _memory(gpt2, [4], first=4)
    assert every.where == "CPU arena" and every.gears == 3 and alone.gears == 1
    assert every.allocated is not None and every.allocated <= 1.1 * alone.allocated, (every, alone)
    assert every.allocated <= every.predicted <= 2 * every.allocated, every  # predicted before any gear was built
    assert every.largest == alone.largest
    assert "memory: CPU arena of 3 gear(s): predicted" in str(report)


# -- 4. the ledger and strict mode, one test per slow path ---------------------------------------------------
# Counted (strict=False) with their figures above: pads and padded rows (the encoder's planned gears, its declared
# range and ShapeVar), dynamic fallbacks (the decoder's planned gears), recompiles (outside the encoder's declared
# range, whose strict test is in section 2). Here each raises in strict mode, on the call, naming the cause; the
# tier-up's two slow paths are counted here too. (A tier-up refused for random draws or effects outside the graph
# needs such a graph: the zoo's models in eval mode have none.)

def test_strict_refuses_to_pad_the_encoder(bert):
    strict, _ = compile_with(bert, strict=True, **{"inference_config.gear_fallback": "pad"})
    check(strict, bert, gears_on(ids(4, 0), [2, 4]))
    with pytest.raises(rewrite.SlowPathError, match=r"padded up to a larger gear: input input_ids dim 0 = 3 was padded "
                                                     r"by 1 elements to a gear\. Fix: add a gear"), torch.no_grad():
        strict(**ids(3, 3))
    check(strict, bert, ids(2, 2))  # a gear: no slow path
    stats = rewrite.stats(strict)
    assert stats.pads == 0 and stats.gears == {(4,): 1, (2,): 1}, stats


def test_strict_refuses_the_decoders_dynamic_fallback(gpt2):
    strict, _ = compile_with(gpt2, strict=True, **{"inference_config.gear_fallback": "dynamic"})
    check(strict, gpt2, gears_on(DECODER.inputs(4, 0), [2, 4]))
    with pytest.raises(rewrite.SlowPathError, match=r"ran the dynamic \(symbolic\) graph: .*input input_ids dim 0 = 3 is "
                                                     r"no gear; the symbolic graph ran\. Fix: add a gear"), torch.no_grad():
        strict(**DECODER.inputs(3, 3))
    check(strict, gpt2, DECODER.inputs(2, 2))
    assert rewrite.stats(strict).dynamic_fallbacks == 0


@pytest.mark.parametrize("strict", [False, True], ids=["counted", "strict"])
def test_a_failed_tier_up_of_the_encoder(bert, monkeypatch, strict):
    from rewrite.exec import program

    def broken(*args, **kwargs):
        raise RuntimeError("planner broke")

    monkeypatch.setattr(program, "make_plan", broken)
    compiled, _ = compile_with(bert, strict=strict, **{"exec.tier_up_calls": 1})
    check(compiled, bert, ids(2, 0))  # the cold call
    if strict:
        with pytest.raises(rewrite.SlowPathError, match=r"will not tier up: graph \w+ keeps its ATen code: tiering up "
                                                         r"failed \(RuntimeError: planner broke\)"), torch.no_grad():
            compiled(**ids(2, 1))
    else:
        check(compiled, bert, ids(2, 1))  # the tier-up: it fails, the ATen code runs
    check(compiled, bert, ids(2, 2))  # and serves on
    stats = rewrite.stats(compiled)
    assert stats.tier_up_refused == (0 if strict else 1) and stats.slow_paths == stats.tier_up_refused, stats


_HOLD = ("import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\n"
         "print('held', flush=True)\n"
         "time.sleep(600)\n")


@pytest.mark.parametrize("strict", [False, True], ids=["counted", "strict"])
def test_decoder_calls_while_another_process_holds_the_tier_up_build_lock(gpt2, tmp_path, monkeypatch, strict):
    """Another process builds into the tier-up folder: the tier-up call does not wait for its lock (put off),
    and the next call, a cold call again, is a tier-up pending."""
    from rewrite.kernels import static_kernels, build_folder

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("REWRITE_CACHE_DIR", raising=False)
    monkeypatch.setattr(static_kernels, "_loaded", static_kernels._Loaded())
    lock = tmp_path / "cache" / "rewrite" / "kernels" / build_folder.OUTPUTS / build_folder.LOCK
    lock.parent.mkdir(parents=True, mode=0o700)
    lock.touch(mode=0o600)
    for folder in (lock.parent.parent.parent, lock.parent.parent):
        os.chmod(folder, 0o700)
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        compiled, backend = compile_with(gpt2, strict=strict, **{"exec.tier_up_calls": 1})
        check(compiled, gpt2, DECODER.inputs(2, 0))  # the cold call
        check(compiled, gpt2, DECODER.inputs(2, 1))  # the tier-up: put off, its ATen code runs
        assert any(f"held by pid {holder.pid}" in n for g in backend.report.graphs for n in g.notes)
        if strict:
            with pytest.raises(rewrite.SlowPathError, match=r"tier-up build was not ready: graph \w+: its static-kernel "
                                                             r"build waits for another process's lock"), torch.no_grad():
                compiled(**DECODER.inputs(2, 2))
        else:
            check(compiled, gpt2, DECODER.inputs(2, 2))
        stats = rewrite.stats(compiled)
        assert stats.tier_up_pending == (0 if strict else 1) and stats.slow_paths == stats.tier_up_pending, stats
    finally:
        holder.kill()
        holder.wait()


# -- 5. batch x sequence: padded and split, every real token equal to eager ---------------------------------

def _request(batch: int, seq: int, seed: int, left: bool) -> dict:
    """A tokenized request of ``batch`` sentences padded to its longest (``seq``): odd rows 3 tokens shorter,
    padded on the right (encoders) or on the left (``left``: the zoo's decoders)."""
    from zoo.archs import tokens

    mask = torch.ones(batch, seq, dtype=torch.long)
    if left:
        mask[1::2, :3] = 0
    else:
        mask[1::2, seq - 3:] = 0
    return {"input_ids": tokens(batch, seed, seq=seq), "attention_mask": mask}


@pytest.mark.parametrize("name", ["bert", "distilbert", "roberta", "gpt2", "llama"])
def test_batch_by_sequence_gears_pad_and_split_and_keep_every_real_token(name):
    """Gears over batch [1, 2, 4] x sequence [6, 12]; requests between them are padded in both dims (the proof:
    padded keys masked out by the attention mask or the causal mask, roberta's position ids a running count) and
    beyond the largest batch split; each real token's output equals eager's."""
    arch = BY_NAME[name]
    model = arch.model()
    left = name == "llama"  # its zoo inputs pad on the left
    served, backend = compile_with(model, **{"inference_config.dynamic_gears_merge_policy": "product",
                                            "inference_config.gear_fallback": "fit"})
    first = _request(4, 12, 0, left)
    for t in first.values():
        rewrite.inference.set_dim_gears(t, {0: [1, 2, 4], 1: [6, 12]})
    requests = [first, _request(3, 9, 1, left), _request(2, 5, 2, left), _request(7, 10, 3, left)]
    with torch.no_grad():
        for request in requests:
            got, want = _main(served(**request)), _main(model(**request))
            real = request["attention_mask"].bool()
            torch.testing.assert_close(got[real], want[real], **TOL)
    assert len(compiled_gears(backend)) == 6, compiled_gears(backend)  # |B| x |L|, whatever symbols the trace made
    stats = rewrite.stats(served)
    # (3, 9) pads to (4, 12) or splits 2 + 1 (by the measured latency), (2, 5) pads to (2, 6); (7, 10) is beyond the
    # largest batch: split (4 + 2 + 1 or 4 + 4), each part padded to sequence 12
    assert stats.pads + stats.splits == 3 and stats.splits >= 1 and stats.dynamic_fallbacks == 0, stats
    assert any("ran as gears 4 + " in message for _, message in stats.events), stats


def test_fit_runs_a_size_the_gears_cover_badly_on_the_symbolic_graph():
    """gear_fallback="fit" weighs the symbolic graph too: (1, 7) would run as gear (1, 40), more than five times its
    work, so the symbolic graph runs it as it is (built then, counted as a dynamic fallback); (2, 5) pads to (2, 6).
    (Nothing is measured yet: the gears' line is a call's work plus an eighth of the largest gear's.)
    Every real token's output equals eager's."""
    model = BY_NAME["bert"].model()
    served, backend = compile_with(model, **{"inference_config.dynamic_gears_merge_policy": "product",
                                            "inference_config.gear_fallback": "fit"})
    first = _request(4, 40, 0, False)
    for t in first.values():
        rewrite.inference.set_dim_gears(t, {0: [1, 2, 4], 1: [6, 40]})
    with torch.no_grad():
        for request in [first, _request(1, 7, 1, False), _request(2, 5, 2, False), _request(1, 7, 3, False)]:
            got, want = _main(served(**request)), _main(model(**request))
            real = request["attention_mask"].bool()
            torch.testing.assert_close(got[real], want[real], **TOL)
    stats = rewrite.stats(served)
    assert stats.dynamic_fallbacks == 2 and stats.pads == 1, stats
    assert any("the symbolic graph ran it as it is" in message for _, message in stats.events), stats


def test_a_decoder_prefill_that_returns_its_kv_cache_pads_its_sequence():
    """A decoder called as generate's prefill is (use_cache on): its keys are concatenated to an empty cache along the
    sequence, which adds nothing, so the sequence still pads; every real token's hidden state and cached key and value
    equal eager's, and the cache comes back at the request's own length."""
    model = rewrite.models.gpt2()
    assert model.config.use_cache
    served, backend = compile_with(model, **{"inference_config.dynamic_gears_merge_policy": "product",
                                            "inference_config.gear_fallback": "pad"})
    first = _request(4, 12, 0, left=False)
    for t in first.values():
        rewrite.inference.set_dim_gears(t, {0: [2, 4], 1: [6, 12]})
    with torch.no_grad():
        served(**first)
        request = _request(3, 9, 1, left=False)
        got, want = served(**request), model(**request)
    real = request["attention_mask"].bool()
    torch.testing.assert_close(got.last_hidden_state[real], want.last_hidden_state[real], **TOL)
    for (k, v), (k0, v0) in zip(_layers(got.past_key_values), _layers(want.past_key_values)):
        assert k.shape == k0.shape and v.shape == v0.shape, (k.shape, k0.shape)
        keys = real[:, None, :, None].expand_as(k0)  # [batch, heads, sequence, head dim]: the real positions
        torch.testing.assert_close(k[keys], k0[keys], **TOL)
        torch.testing.assert_close(v[keys], v0[keys], **TOL)
    assert rewrite.stats(served).pads == 1, rewrite.stats(served)


def _layers(cache) -> list:
    """(keys, values) per layer of a transformers cache (its layers' attributes, or the legacy tuple form)."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return [(k, v) for k, v in cache]


# -- 6. padded_tokens="skip": rows run in groups cut to their own length -------------------------------------

def _ragged(lengths: list, seed: int, left: bool = False) -> dict:
    """A request whose rows have these own lengths, padded to the longest (right, or ``left``), ids 0 at the padding."""
    from zoo.archs import tokens

    n = max(lengths)
    positions = torch.arange(n)[None, :]
    own = torch.tensor(lengths)[:, None]
    mask = (positions >= n - own if left else positions < own).long()
    return {"input_ids": tokens(len(lengths), seed, seq=n) * mask, "attention_mask": mask}


def _skip_compiled(model, strict: bool = False, fallback: str = "pad"):
    served, backend = compile_with(model, strict=strict, **{"inference_config.dynamic_gears_merge_policy": "product",
                                                            "inference_config.gear_fallback": fallback,
                                                            "inference_config.padded_tokens": "skip"})
    first = _ragged([12] * 4, 0)
    for t in first.values():
        rewrite.inference.set_dim_gears(t, {0: [1, 2, 4], 1: [6, 12]})
    return served, backend, first


@pytest.mark.parametrize("name", ["bert", "distilbert", "roberta", "gpt2", "llama"])
def test_skipped_padding_keeps_every_real_token_and_zeroes_the_rest(name):
    """padded_tokens="skip": a request of rows with lengths [12, 2, 2] runs as its two short rows cut to 2 (padded to
    the gear (2, 6)) and its long row at 12, cheaper by the gears' predicted cost than the whole request at (3, 12);
    [5, 1, 9] as (2, 5) and (1, 9). Every real token's output equals eager's; each padded position holds eager's
    output where its group computed it and 0 where skipped; the ledger counts the calls and the positions skipped.
    Left padding (the zoo's decoders' own) has nothing at a row's end to skip."""
    model = BY_NAME[name].model()
    served, _, first = _skip_compiled(model)
    with torch.no_grad():
        served(**first)
        for request in (_ragged([12, 2, 2], 1), _ragged([5, 1, 9], 2)):
            got, want = _main(served(**request)), _main(model(**request))
            real = request["attention_mask"].bool()
            assert got.shape == want.shape
            torch.testing.assert_close(got[real], want[real], **TOL)
            padded, eager_there = got[~real], want[~real]
            skipped = (padded == 0).all(-1)
            assert skipped.any(), name
            torch.testing.assert_close(padded[~skipped], eager_there[~skipped], **TOL)
        stats = rewrite.stats(served)
        assert stats.regroups == 2 and stats.tokens_computed == 0, stats
        # (3, 12) less (2 rows at 2, 1 at 12); (3, 9) less (2 rows at 5, 1 at 9)
        assert stats.skipped_tokens == (36 - 2 * 2 - 12) + (27 - 2 * 5 - 9), stats
        left = _ragged([12, 2, 2], 3, left=True)
        got, want = _main(served(**left)), _main(model(**left))
        torch.testing.assert_close(got, want, **TOL)  # nothing skipped: every position is eager's
        assert rewrite.stats(served).regroups == 2


def test_skipped_padding_on_a_model_without_a_mask_is_a_counted_refusal(bert):
    """Without an attention mask no input says which positions are padding: the tokens are computed, and the
    ledger says why (strict: the first call raises, naming the setting)."""
    served, _, first = _skip_compiled(bert)
    first = {"input_ids": first["input_ids"]}
    check(served, bert, first)
    stats = rewrite.stats(served)
    assert stats.tokens_computed == 1 and stats.regroups == 0, stats
    assert any("attention mask" in message for kind, message in stats.events if kind == "tokens_computed"), stats
    strict, _, first = _skip_compiled(bert, strict=True)
    with pytest.raises(rewrite.SlowPathError, match="padded_tokens='skip'"):
        strict(input_ids=first["input_ids"])


def test_skipped_padding_needs_a_fallback_that_serves_sizes_between_gears(bert):
    """gear_fallback="error" serves only the gears themselves: the groups could not run, so nothing is skipped."""
    served, _, first = _skip_compiled(bert, fallback="error")
    check(served, bert, first)
    stats = rewrite.stats(served)
    assert stats.tokens_computed == 1 and any("gear_fallback='error'" in m for _, m in stats.events), stats
