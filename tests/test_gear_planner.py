"""The gear planner: exact optimum (against brute force), waste figures, budgets, argument errors, and the
traffic recording through real compiled models, then serving with the planned gears."""
from __future__ import annotations

import itertools
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rewrite
from rewrite import models
from rewrite.gears import (GearError, evaluate_gears, get_dim_gears, measure_latency, plan_gears,
                           power_of_two_ladder, recording)
from rewrite.gears import traffic
from rewrite.gears.traffic import Recording, Stream


# -- brute force -----------------------------------------------------------------------------------------------

def served_cost(hist: dict, gears, lat) -> float:
    gears = sorted(gears)
    return sum(c * lat(next(g for g in gears if g >= s)) for s, c in hist.items())


def brute_force(hist: dict, candidates, k_max: int, lat, fits=lambda gears: True) -> float | None:
    """The least cost over every set of at most k_max candidates covering the largest size."""
    best = None
    top = max(hist)
    for k in range(1, k_max + 1):
        for gears in itertools.combinations(sorted(candidates), k):
            if gears[-1] < top or not fits(gears):
                continue
            cost = served_cost(hist, gears, lat)
            best = cost if best is None else min(best, cost)
    return best


histograms = st.dictionaries(st.integers(1, 40), st.integers(1, 25), min_size=1, max_size=7)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hist=histograms, k=st.integers(1, 4), data=st.data())
def test_plan_is_the_brute_force_optimum(hist, k, data):
    measured = data.draw(st.booleans())
    sizes = sorted(hist)
    extra = data.draw(st.lists(st.integers(1, 48), max_size=3))
    candidates = sorted(set(sizes) | set(extra) | {sizes[-1]})
    if measured:  # any positive latency per candidate, not even monotone (alignment makes real ones jump)
        table = {c: data.draw(st.floats(0.1, 10.0)) for c in set(candidates) | set(sizes)}
        latency, lat = table, table.__getitem__
    else:
        latency, lat = None, float
    plan = plan_gears(hist, max_gears=k, latency=latency, candidates=candidates, monotone=False)
    best = brute_force(hist, [c for c in candidates if c >= sizes[0]], k, lat)
    assert served_cost(hist, plan.gears, lat) == pytest.approx(best, rel=1e-9)
    assert len(plan.gears) <= k and plan.gears == sorted(set(plan.gears)) and plan.gears[-1] >= sizes[-1]
    assert set(plan.gears) <= set(candidates)
    assert 0.0 <= plan.expected_waste <= 1.0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hist=histograms, k=st.integers(1, 4), data=st.data())
def test_budgeted_plan_is_the_brute_force_optimum_within_the_budgets(hist, k, data):
    sizes = sorted(hist)
    memory = {s: data.draw(st.integers(1, 100)) for s in sizes}
    compile_s = {s: data.draw(st.floats(0.5, 5.0)) for s in sizes}
    mem_cap = data.draw(st.integers(1, 250))
    comp_cap = data.draw(st.floats(0.5, 12.0))

    def fits(gears):
        return sum(memory[g] for g in gears) <= mem_cap and sum(compile_s[g] for g in gears) <= comp_cap

    best = brute_force(hist, sizes, k, float, fits)
    kwargs = dict(max_gears=k, memory=memory, max_memory_bytes=mem_cap, compile_s=compile_s, max_compile_s=comp_cap,
                  candidates=sizes)
    if best is None:
        with pytest.raises(GearError, match="fits the budgets"):
            plan_gears(hist, **kwargs)
        return
    plan = plan_gears(hist, **kwargs)
    assert served_cost(hist, plan.gears, float) == pytest.approx(best, rel=1e-9)
    assert fits(plan.gears)
    assert plan.memory_bytes == sum(memory[g] for g in plan.gears)
    assert plan.compile_s == pytest.approx(sum(compile_s[g] for g in plan.gears))


# -- exact figures on hand cases ---------------------------------------------------------------------------------

def test_waste_is_padded_rows_over_rows_run():
    plan = plan_gears([1, 3], max_gears=1)
    assert plan.gears == [3]
    assert plan.expected_waste == pytest.approx(1 / 3) and plan.padded_rows == pytest.approx(1 / 3)
    # {2: 3, 3: 1, 8: 1} with 2 gears: [3, 8] runs 3*3 + 3 + 8 = 20 rows, 3 of them padding; [2, 8] would run 22
    plan = plan_gears({2: 3, 3: 1, 8: 1}, max_gears=2)
    assert plan.gears == [3, 8]
    assert plan.expected_waste == pytest.approx(3 / 20)
    assert plan.cost_per_request == pytest.approx(20 / 5)
    # the ladder [1, 2, 4, 8]: 2 -> 2, 3 -> 4, 8 -> 8: 6 + 4 + 8 = 18 rows, 1 padded
    assert plan.ladder == [1, 2, 4, 8] and plan.ladder_waste == pytest.approx(1 / 18)


def test_enough_gears_waste_nothing_and_equal_costs_take_fewer_gears():
    plan = plan_gears([5, 5, 5, 9], max_gears=8)
    assert plan.gears == [5, 9] and plan.expected_waste == 0.0
    # a gear at 1 and 2 cost the same as one at 2 (with latency flat below 2): fewer gears win
    plan = plan_gears({1: 4, 2: 4}, max_gears=2, latency={2: 1.0})
    assert plan.gears == [2] and plan.expected_waste == 0.0


def test_measured_latency_decides_not_rows():
    # 64 measured faster than 48 (an aligned kernel): sizes 33..48 go to 64 although it pads more rows
    lat = {16: 1.0, 32: 2.0, 48: 5.0, 64: 4.0}
    plan = plan_gears({16: 10, 40: 10, 64: 1}, max_gears=2, latency=lat, monotone=False)
    assert plan.gears == [16, 64]
    assert plan.padded_rows > 0 and plan.expected_waste == pytest.approx(10 * (4.0 - 3.5) / (10 + 10 * 4.0 + 4.0))


def test_measured_latency_is_made_non_decreasing_by_default():
    # noise made 2 rows look faster than 1: pooled to their mean (1.5), so 1 is no free ride to 2
    noisy = {1: 2.0, 2: 1.0, 4: 4.0}
    plan = plan_gears({1: 10, 2: 1, 4: 1}, max_gears=2, latency=noisy)
    assert plan.gears == [2, 4]
    assert "made non-decreasing: 2 adjusted" in str(plan)
    # pooled, 1 and 2 cost the same: serving 1 at 2 wastes nothing, and the plan says so
    assert plan.expected_waste == pytest.approx(evaluate_gears({1: 10, 2: 1, 4: 1}, plan.gears,
                                                               latency={1: 1.5, 2: 1.5, 4: 4.0}).expected_waste)
    raw = plan_gears({1: 10, 2: 1, 4: 1}, max_gears=2, latency=noisy, monotone=False)
    assert raw.gears == [2, 4]  # taken at face value, 2 is cheaper than 1
    with pytest.raises(GearError, match="monotone must be True or False"):
        plan_gears([1], monotone="yes")


def test_ladder_and_max_waste():
    assert power_of_two_ladder(1) == [1] and power_of_two_ladder(5) == [1, 2, 4, 8] and power_of_two_ladder(8) == [1, 2, 4, 8]
    zipf = {k: 1.0 / k for k in range(1, 65)}
    plan = plan_gears(zipf, max_gears=16, max_waste=0.10)
    assert plan.expected_waste <= 0.10 < plan.ladder_waste
    fewer = plan_gears(zipf, max_gears=len(plan.gears) - 1)
    assert fewer.expected_waste > 0.10  # the fewest gears that reach it
    assert plan.speedup_vs_ladder > 1
    missed = plan_gears(zipf, max_gears=3, max_waste=0.01)
    assert len(missed.gears) == 3 and "NOT reached" in str(missed)


def test_describe_evaluate_gear_for_and_apply():
    hist = {1: 50, 2: 20, 3: 10, 12: 5, 30: 2}
    plan = plan_gears(hist, max_gears=3)
    text = str(plan)
    assert str(plan.gears) in text and "power-of-two ladder [1, 2, 4, 8, 16, 32]" in text
    assert f"{plan.expected_waste:.1%}" in text and plan.describe() == text
    assert sum(s.requests for s in plan.shares) == pytest.approx(1.0)
    assert sum(s.time for s in plan.shares) == pytest.approx(1.0)
    assert plan.gear_for(1) == plan.gears[0] and plan.gear_for(30) == 30 and plan.gear_for(31) is None
    same = evaluate_gears(hist, plan.gears)
    assert same.expected_waste == pytest.approx(plan.expected_waste)
    ladder = evaluate_gears(hist, power_of_two_ladder(30))
    assert ladder.expected_waste == pytest.approx(plan.ladder_waste)
    x = torch.zeros(4, 3)
    assert plan.apply(x, dim=0) is x and get_dim_gears(x) == {0: tuple(plan.gears)}


def test_budgets_are_respected():
    hist = {k: 1 for k in range(1, 33)}
    assert len(plan_gears(hist, max_gears=8, memory=100, max_memory_bytes=350).gears) == 3
    assert len(plan_gears(hist, max_gears=8, compile_s=2.0, max_compile_s=5.0).gears) == 2
    plan = plan_gears(hist, max_gears=8, memory=lambda s: 10 * s, max_memory_bytes=700)
    assert plan.memory_bytes <= 700 and plan.gears[-1] == 32
    with pytest.raises(GearError, match=r"max_memory_bytes=300 \(the smallest gear covering it, 32, needs 320 bytes"):
        plan_gears(hist, memory=lambda s: 10 * s, max_memory_bytes=300)
    with pytest.raises(GearError, match=r"max_compile_s=1"):
        plan_gears(hist, compile_s=2.0, max_compile_s=1.0)


def _raises(latency_error):
    def f(s):
        raise latency_error
    return f


@pytest.mark.parametrize("sizes, kwargs, message", [
    ([], {}, "sizes is empty"),
    ({3: 0}, {}, "sizes is empty"),
    ([0, 2], {}, "sizes must hold positive ints"),
    ([-1], {}, "sizes must hold positive ints"),
    ([1.5], {}, "sizes must hold positive ints"),
    ([True], {}, "sizes must hold positive ints"),
    ("12", {}, "sizes must be a list of sizes"),
    (5, {}, "sizes must be a list of sizes"),
    ({2: -1}, {}, "counts must be finite numbers >= 0"),
    ({2: float("nan")}, {}, "counts must be finite numbers >= 0"),
    ({2.0: 1}, {}, "sizes must hold positive ints"),
    ([2], {"max_gears": 0}, r"max_gears must be an int in \[1, 100\]"),
    ([2], {"max_gears": 101}, r"max_gears must be an int in \[1, 100\]"),
    ([2], {"max_gears": 2.0}, "max_gears must be an int"),
    ([2], {"max_gears": True}, "max_gears must be an int"),
    ([2], {"latency": "fast"}, "latency must be None, a {size: seconds} mapping or a callable"),
    ([2], {"latency": {}}, "latency is an empty mapping"),
    ([2], {"latency": {2: 0.0}}, "latency at size 2 is 0.0; it must be a finite number > 0"),
    ([2, 9], {"latency": {1: 1.0, 8: 2.0}}, "latency was measured up to size 8, but the traffic reaches 9"),
    ([2], {"latency": lambda s: -1}, "latency at size 2 is -1"),
    ([2], {"latency": _raises(RuntimeError("no device"))}, r"latency\(2\) raised RuntimeError: no device"),
    ([2], {"max_memory_bytes": 10}, "max_memory_bytes needs memory="),
    ([2], {"memory": 1, "max_memory_bytes": -1}, "max_memory_bytes must be a number >= 0"),
    ([2], {"memory": "big"}, "memory must be bytes per gear"),
    ([2], {"memory": -5}, "memory must be a finite number >= 0"),
    ([2], {"compile_s": {2: float("inf")}}, "compile_s at size 2 is inf"),
    ([2], {"max_compile_s": 3}, "max_compile_s needs compile_s="),
    ([2], {"max_waste": 1.5}, r"max_waste must be a share in \[0, 1\]"),
    ([2, 9], {"candidates": [1, 4]}, "has no size >= the largest observed size 9"),
    ([2], {"candidates": [0, 2]}, "candidates must hold positive ints"),
    ([2], {"stream": "x dim 0"}, "stream= selects a recorded dim and needs a Recording"),
])
def test_bad_arguments_raise_gear_error_naming_the_argument(sizes, kwargs, message):
    with pytest.raises(GearError, match=message.replace("{", r"\{").replace("}", r"\}")):
        plan_gears(sizes, **kwargs)


def test_evaluate_and_measure_check_their_arguments():
    with pytest.raises(GearError, match="do not cover the largest observed size 9"):
        evaluate_gears([1, 9], [4, 8])
    with pytest.raises(GearError, match="gears must hold positive ints"):
        evaluate_gears([1], [0])
    with pytest.raises(GearError, match="fn and make_input must be callables"):
        measure_latency(None, lambda s: s, [1])
    with pytest.raises(GearError, match=r"repeat must be an int in \[1, 10000\]"):
        measure_latency(lambda x: x, lambda s: s, [1], repeat=0)
    with pytest.raises(GearError, match="sizes is empty"):
        measure_latency(lambda x: x, lambda s: s, [])


def test_measure_latency_times_each_size_with_few_calls():
    calls = []
    table = measure_latency(lambda a, b: calls.append((a, b)), lambda s: (s, "x"), [4, 1, 4], repeat=3, warmup=1)
    assert sorted(table) == [1, 4] and all(v > 0 for v in table.values())
    assert calls == [(1, "x")] * 4 + [(4, "x")] * 4
    plan = plan_gears([1, 4, 4], latency=table)  # which gears depends on the (meaningless) times measured
    assert plan.gears[-1] == 4 and "measured at 2 sizes" in str(plan)


# -- recordings ----------------------------------------------------------------------------------------------------

def test_recording_is_a_histogram_per_stream_and_selects_one():
    rec = Recording()
    a, b = Stream("f (m.py:1)", "input x dim 0"), Stream("f (m.py:1)", "input x dim 1")
    for size in (3, 3, 5):
        traffic.note((rec,), (a, b), (size, 16))
    assert rec.streams == {a: {3: 2, 5: 1}, b: {16: 3}}
    assert rec.histogram() == {3: 2, 5: 1}  # the only stream that took more than one size
    assert rec.histogram("dim 1") == {16: 3} and rec.histogram(b) == {16: 3}
    assert plan_gears(rec).stream == "f (m.py:1): input x dim 0"
    traffic.note((rec,), (a, b), (3, 8))
    with pytest.raises(GearError, match=r"2 streams \(2 took more than one size\); pick one with stream="):
        plan_gears(rec)
    with pytest.raises(GearError, match=r"stream='x dim' matches 2 of the recorded streams"):
        plan_gears(rec, stream="x dim")
    assert plan_gears(rec, stream="x dim 1").gears == [8, 16]
    with pytest.raises(GearError, match="the recording is empty"):
        plan_gears(Recording())
    assert "2 stream(s)" in str(rec) and "most frequent 3 (3)" in str(rec)


def test_recording_counts_every_thread_exactly():
    rec = Recording()
    s = Stream("f", "input x dim 0")

    def work(k):
        for i in range(500):
            traffic.note((rec,), (s,), (1 + (i + k) % 7,))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(rec.histogram().values()) == 2000 and set(rec.histogram()) == set(range(1, 8))


def test_recordings_nest_and_close():
    assert traffic.active is None
    with recording() as outer:
        with recording() as inner:
            assert traffic.active == (outer, inner)
        assert traffic.active == (outer,)
        with recording(outer) as same:
            assert same is outer
    assert traffic.active is None
    with pytest.raises(GearError, match="into must be a Recording"):
        with recording({}):
            pass


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()


def test_recording_through_geared_dispatch_counts_the_asked_size_before_padding():
    model = _mlp()
    config = rewrite.CompilerConfig()
    config.inference_config.gear_fallback = "pad"
    fn = torch.compile(model, backend=rewrite.get_backend(config), fullgraph=True)
    first = torch.randn(4, 8)
    rewrite.inference.set_dim_gears(first, {0: [1, 2, 4, 8]})
    with torch.no_grad():
        fn(first)  # compiles outside the recording: not counted
        with recording() as rec:
            for b in (1, 3, 3, 5, 8):
                fn(torch.randn(b, 8))
        fn(torch.randn(2, 8))  # after the recording: not counted
    (stream, hist), = rec.streams.items()
    assert hist == {1: 1, 3: 2, 5: 1, 8: 1}
    assert stream.dim == "input args[0] dim 0" and stream.function.startswith("Sequential.forward (container.py:"), stream


def test_recording_a_dynamic_compile_then_serving_the_planned_gears_matches_eager():
    """The three lines: record traffic through a dynamic=True compile (batch 1 specialized by Dynamo is
    recorded too), plan, compile with the planned gears and pad; every size matches eager."""
    model = _mlp()
    traffic_sizes = [1] * 6 + [2, 3, 3, 5, 6, 6, 6, 7, 9, 12, 12]
    dynamic = torch.compile(model, backend=rewrite.get_backend(), dynamic=True)
    with torch.no_grad(), recording() as rec:
        for b in traffic_sizes:
            dynamic(torch.randn(b, 8))
    assert rec.histogram() == {s: traffic_sizes.count(s) for s in set(traffic_sizes)}
    plan = plan_gears(rec, max_gears=3)
    assert plan.expected_waste == pytest.approx(evaluate_gears(traffic_sizes, plan.gears).expected_waste)
    assert plan.gears == [1, 6, 12]  # 1 is a gear when the traffic says so

    torch._dynamo.reset()
    config = rewrite.CompilerConfig()
    config.inference_config.gear_fallback = "pad"
    served = torch.compile(model, backend=rewrite.get_backend(config), fullgraph=True)
    x = plan.apply(torch.randn(plan.gears[-1], 8), dim=0)
    with torch.no_grad():
        served(x)
        for b in sorted(set(traffic_sizes)):
            y = torch.randn(b, 8)
            torch.testing.assert_close(served(y), model(y), rtol=1e-5, atol=1e-5)


def test_recording_a_real_transformer_with_a_dim_marked_dynamic_counts_batch_1_too():
    """A dim Dynamo made dynamic (mark_dynamic, or automatic dynamic shapes) is recorded by the symbolic
    graph; batch 1, which Dynamo specializes into a static graph of its own, is recorded by that graph."""
    model = models.bert()
    fn = torch.compile(model, backend=rewrite.get_backend())
    first = models.token_batch(2, 16)
    torch._dynamo.mark_dynamic(first, 0)
    with torch.no_grad():
        fn(first)  # compiles outside the recording
        with recording() as rec:
            for b in (2, 4, 4, 3, 1):
                fn(models.token_batch(b, 16, seed=b))
    (stream, hist), = rec.streams.items()
    assert hist == {1: 1, 2: 1, 3: 1, 4: 2}
    assert stream.function.startswith("BertModel.forward") and stream.dim.endswith("dim 0")
    assert plan_gears(rec, max_gears=2).gears == [2, 4]


def test_batch_and_sequence_gears_are_planned_together_under_one_budget():
    from rewrite.gears import plan_gear_axes

    # sentence traffic: most requests small and short, a few long ones
    shapes = [(1, 12)] * 40 + [(2, 20)] * 20 + [(8, 30)] * 10 + [(8, 120)] * 2 + [(16, 60)] * 3
    plan = plan_gear_axes(shapes, max_gears=6)
    assert plan.gears <= 6 and plan.batch[-1] == 16 and plan.sequence[-1] == 120, plan
    # exact for what it chose: every request padded to its gear pair, b * s units each
    cost = sum(min(b2 for b2 in plan.batch if b2 >= b) * min(s2 for s2 in plan.sequence if s2 >= s) for b, s in shapes)
    assert plan.cost == cost and plan.real == sum(b * s for b, s in shapes)
    # at least as good as any split of the budget into the largest sizes only, and the ladder's gears
    assert plan.cost <= sum(16 * 120 for _ in shapes)
    lone = plan_gear_axes(shapes, max_gears=1)
    assert (lone.batch, lone.sequence) == ([16], [120]) and lone.cost > plan.cost
    # a budget as large as the traffic's distinct pairs pads nothing the planner can avoid: a gear per size
    full = plan_gear_axes(shapes, max_gears=100)
    assert full.expected_waste < plan.expected_waste
    # a measured latency that barely grows with the sequence makes long sequence gears cheap: fewer are needed
    flat = plan_gear_axes(shapes, max_gears=6, latency=lambda b, s: b * (1000 + s))
    assert len(flat.sequence) <= len(plan.sequence), (flat, plan)
    with pytest.raises(GearError, match=r"a \(batch, sequence\) pair"):
        plan_gear_axes([(1, 2, 3)])


def test_gear_pairs_follow_traffic_whose_large_batches_are_also_long():
    """Any (batch, sequence) pairs, not a grid: where the longest requests are the large batches, a grid spends most
    of its budget on pairs nothing uses; pairs padding the same traffic cost less, and the cost they predict is
    exact (every request served by its cheapest covering pair, as gear_fallback="pad" does)."""
    from rewrite.gears import plan_gear_axes, plan_gear_pairs

    shapes = [(1, 16)] * 60 + [(2, 24)] * 30 + [(4, 40)] * 20 + [(8, 64)] * 10 + [(16, 100)] * 5 + [(32, 160)] * 2
    pairs = plan_gear_pairs(shapes, max_gears=6)
    grid = plan_gear_axes(shapes, max_gears=6)
    assert pairs.gears == 6 and pairs.expected_waste == 0 < grid.expected_waste, (pairs, grid)
    assert (32, 160) in pairs.pairs  # the largest request's gear: every request has one
    fewer = plan_gear_pairs(shapes, max_gears=3)
    cost = sum(min(gb * gs for gb, gs in fewer.pairs if gb >= b and gs >= s) for b, s in shapes)
    assert fewer.cost == cost and fewer.real == sum(b * s for b, s in shapes) and fewer.cost > pairs.cost
    assert fewer.dim_gears == {0: [b for b, _ in fewer.pairs], 1: [s for _, s in fewer.pairs]}
    # the greedy choice is at least as good as the grid for every budget here
    for k in range(1, 7):
        assert plan_gear_pairs(shapes, max_gears=k).cost <= plan_gear_axes(shapes, max_gears=k).cost
    with pytest.raises(GearError, match="max_gears must be an int"):
        plan_gear_pairs(shapes, max_gears=0)


def test_gear_pairs_serve_an_encoder_under_zip_equal_to_eager():
    """The plan's dim_gears on input_ids and attention_mask under "zip": one graph per pair, calls between them padded."""
    from rewrite.gears import plan_gear_pairs

    model = models.bert().eval()
    plan = plan_gear_pairs([(1, 8)] * 5 + [(2, 12)] * 3 + [(4, 16)] * 2, max_gears=3)
    assert plan.pairs == [(1, 8), (2, 12), (4, 16)]
    config = rewrite.CompilerConfig(**{"inference_config.dynamic_gears_merge_policy": "zip",
                                       "inference_config.gear_fallback": "pad"})
    backend = rewrite.get_backend(config)
    served = torch.compile(model, backend=backend, fullgraph=True)
    first = {"input_ids": models.token_batch(4, 16), "attention_mask": torch.ones(4, 16, dtype=torch.long)}
    for t in first.values():
        rewrite.inference.set_dim_gears(t, plan.dim_gears)
    with torch.no_grad():
        served(**first)  # the call that carries the declared gears
        for b, s in [(4, 16), (1, 8), (2, 10), (3, 16)]:
            ids = models.token_batch(b, s, seed=b + s)
            mask = torch.ones(b, s, dtype=torch.long)
            mask[0, s - 2:] = 0
            got, want = served(input_ids=ids, attention_mask=mask), model(input_ids=ids, attention_mask=mask)
            real = mask.bool()
            torch.testing.assert_close(got.last_hidden_state[real], want.last_hidden_state[real], rtol=1e-4, atol=1e-4)
    stats = rewrite.stats(served)
    assert {key[:2] for key in stats.gears} == {(4, 16), (1, 8)}, stats  # the calls at a pair ran its graph
    assert stats.pads == 2, stats  # (2, 10) to (2, 12), (3, 16) to (4, 16)


def test_group_shapes_cut_each_request_where_its_rows_lengths_part():
    """padded_tokens="skip" runs a request's rows in groups cut to their own length: group_shapes gives those calls'
    (rows, length) to plan gears on. Eight rows of 2 tokens and one of 100 are two calls (8 x 2 and 1 x 100 cost
    16 + 100 tokens and two calls' fixed cost, against 900 and one); rows of near lengths stay one call."""
    from rewrite.gears import group_shapes

    assert group_shapes([[100] + [2] * 8]) == [(8, 2), (1, 100)]
    assert group_shapes([[30, 31, 29], [7]]) == [(3, 31), (1, 7)]
    assert group_shapes([[100] + [2] * 8], call_tokens=10_000) == [(9, 100)]  # calls dear: nothing is cut


@given(st.lists(st.lists(st.integers(1, 300), min_size=1, max_size=24), min_size=1, max_size=6))
@settings(max_examples=50, deadline=None)
def test_group_shapes_hold_every_row_at_its_own_length_or_more(requests):
    from rewrite.gears import group_shapes

    shapes = group_shapes(requests)
    assert sum(rows for rows, _ in shapes) == sum(len(r) for r in requests)
    assert all(length in {x for r in requests for x in r} for _, length in shapes)  # a group is cut to a row's length
    cost = sum(rows * length + 256 for rows, length in shapes)
    assert cost <= sum(len(r) * max(r) + 256 for r in requests)  # never dearer than the requests as they are


def test_group_shapes_refuse_what_is_not_a_request_of_lengths():
    from rewrite.gears import group_shapes

    with pytest.raises(ValueError, match="own lengths"):
        group_shapes([[3, 0]])
    with pytest.raises(ValueError, match="own lengths"):
        group_shapes([[]])
