"""Kernels measured at a graph's own shapes (rewrite.cost.kernel_times): what is measured, that extraction
follows the measured figures (the rules-off form where it is faster), the file read as hostile input,
and the rules-on/off invariant on small models."""
from __future__ import annotations

import dataclasses
import json
import logging
import os

import pytest
import sympy
import torch

import rewrite
from rewrite import models
from rewrite.config import CompilerConfig
from rewrite.cost import calibration, graph_cost, machine, op_cost
from rewrite.cost.kernel_times import KernelTimes, signature
from rewrite.ir import TensorMeta

aten = torch.ops.aten
FIXED = calibration.DEFAULT
# The speed rules of the latency benchmarks (benchmarks/optimizer.py ISSUE_RULES): "rules off" switches them off.
SPEED_RULES = ["gemm", "fused", "algebra.identity_chains", "shape.fresh_copies", "shape.pointwise_reshapes"]


def meta(*shape, dtype=torch.float32, device="cpu"):
    return TensorMeta(dtype, tuple(sympy.Integer(s) for s in shape), torch.device(device))


class Table(KernelTimes):
    """Kernel times from a table (signature -> seconds), so a test decides what the machine measured."""

    def __init__(self, pick):
        super().__init__(None)
        self.pick = pick  # (target, in_metas) -> seconds or None

    def seconds(self, target, out_meta, in_metas):
        return self.pick(target, in_metas)


def test_what_is_measured_static_cpu_float_gemms_and_attention():
    x, w = meta(8, 32), meta(32, 96)
    assert signature(aten.mm.default, [x, w]) == "aten.mm.default(float32[8,32];float32[32,96])"
    assert signature(aten.add.Tensor, [x, x]) is None  # pointwise: the family model
    sym = TensorMeta(torch.float32, (sympy.Symbol("s0"), sympy.Integer(32)))
    assert signature(aten.mm.default, [sym, w]) is None  # a symbolic size: the family model
    assert signature(aten.mm.default, [meta(8, 32, device="meta"), w]) is None  # not a CPU tensor
    assert signature(aten.mm.default, [meta(8, 32, dtype=torch.int64), w]) is None


def test_a_measured_kernel_is_timed_once_and_replaces_the_rate():
    times = KernelTimes(None)
    x, w, out = meta(16, 64), meta(64, 64), meta(16, 64)
    t = times.seconds(aten.mm.default, out, [x, w])
    assert t is not None and 1e-8 <= t < 0.1
    assert times.seconds(aten.mm.default, out, [x, w]) == t  # kept, not measured again
    assert len(times.times) == 1
    with calibration.use(dataclasses.replace(FIXED, kernel_times=times)):
        assert op_cost(aten.mm.default, out, [x, w]) == t
    with calibration.use(FIXED):  # a calibration without kernel times: the fitted rate
        assert op_cost(aten.mm.default, out, [x, w]) != t


def test_an_exhausted_budget_leaves_the_model_to_answer():
    times = KernelTimes(None, budget_s=0.0)
    assert times.seconds(aten.mm.default, meta(4, 4), [meta(4, 4), meta(4, 4)]) is None


def test_mm_of_one_value_twice_is_left_to_the_model():
    # in_metas are distinct inputs: mm(x, x) arrives with one meta, and which operand it is cannot be told
    assert KernelTimes(None).seconds(aten.mm.default, meta(4, 4), [meta(4, 4)]) is None


def _merged(report) -> bool:
    return report.graphs[0].ops_after.get("aten.split.Tensor", 0) > 0


def _bert_report(kernel_times):
    config = CompilerConfig()
    config.experimental_config.frozen_parameter = True
    with torch.no_grad(), calibration.use(dataclasses.replace(FIXED, kernel_times=kernel_times)):
        return rewrite.explain(models.bert(), models.token_batch(2, 16), config=config)


def test_extraction_keeps_separate_gemms_where_the_merged_gemm_measures_slower():
    hidden = 64  # models.bert(): Q, K and V are 64 wide each; merged, one GEMM 192 (or two of them, 128) wide
    merged_widths = {(2 * hidden,), (3 * hidden,)}

    def merged_is_slow(target, in_metas):
        if target is aten.addmm.default and in_metas[0].shape in merged_widths:
            return 1e-3  # a millisecond: far more than three 64-wide GEMMs
        return None

    def merged_is_fast(target, in_metas):
        if target is aten.addmm.default and in_metas[0].shape in merged_widths:
            return 1e-9
        return None

    slow, fast = _bert_report(Table(merged_is_slow)), _bert_report(Table(merged_is_fast))
    assert not _merged(slow), slow.graphs[0].ops_after
    assert _merged(fast), fast.graphs[0].ops_after
    torch.testing.assert_close(slow.result[0], fast.result[0], atol=2e-5, rtol=1e-4)


# -- the invariant: the rules never make a graph costlier than with them off --------------------------

def _optimized_cost(model, args, disabled):
    config = CompilerConfig()
    config.experimental_config.frozen_parameter = True
    config.rules.disabled = list(disabled)
    with torch.no_grad():
        report = rewrite.explain(model, *args, config=config)
    return report.graphs[0].predicted_cost[1], report.graphs[0].ops_after


@pytest.mark.parametrize("name", ["bert", "gpt2", "t5", "vit"])
def test_rules_on_never_cost_more_than_rules_off_with_kernels_measured_at_the_graph_shapes(name):
    """With this machine's calibration and its kernels measured at the graph's own shapes (the process
    calibration, as a user's compile gets it), the speed rules' graph is never predicted slower than
    the rules-off graph: extraction picks the rules-off form wherever that measures faster.
    (benchmarks/zoo.py's 'rules on vs off' column checks the same on the clock.)"""
    model = getattr(models, name)()
    model = model.encoder if name == "t5" else model
    args = (torch.randn(2, 3, 32, 32),) if name == "vit" else (models.token_batch(2, 16),)
    assert calibration.current().kernel_times is not None or os.environ.get(calibration.KERNEL_TIMES_ENV) == "0"
    on, ops_on = _optimized_cost(model, args, ())
    off, ops_off = _optimized_cost(model, args, SPEED_RULES)
    assert on <= off * (1 + 1e-9), f"rules on {on * 1e6:.1f} us > rules off {off * 1e6:.1f} us\n{ops_on}\n{ops_off}"


# -- the file: this user's, bounded, every entry checked ----------------------------------------------

def test_figures_are_saved_and_read_back_by_the_next_process(tmp_path):
    path = str(tmp_path / "kernel-times.json")
    first = KernelTimes(path)
    t = first.seconds(aten.mm.default, meta(8, 16), [meta(8, 16), meta(16, 16)])
    first.save()
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    second = KernelTimes(path)
    assert second.times == {signature(aten.mm.default, [meta(8, 16), meta(16, 16)]): t}


MM = "aten.mm.default(float32[4,8];float32[8,8])"


def _figures(times: dict, **fields) -> str:
    """A figures file (rewrite.cost.machine) holding ``times``, with ``fields`` changed."""
    doc = {"format": machine.FORMAT, "key": machine.cache_key(), "saved_at": "2025-01-01 00:00:00",
           "calibration": None, "kernel_times": times, **fields}
    return json.dumps(doc)


@pytest.mark.parametrize("content", [
    lambda: "not json",
    lambda: _figures({"aten.mm.default(float32[1,1];float32[1,1])": -1.0}),
    lambda: _figures({"k": float("inf")}).replace("Infinity", "1e999"),
    lambda: _figures({"k": True}),
    lambda: _figures([], extra=1),
    lambda: _figures({}, format=99),
    lambda: _figures({MM: 5.0}, key={**machine.cache_key(), "torch": "1.0.0"}),  # stale
    lambda: json.dumps({"format": 1, "times": {MM: 5.0}}),  # the kernel-times file of an older rewrite
], ids=["not json", "negative", "infinite", "bool", "extra field", "format 99", "stale", "older rewrite"])
def test_a_damaged_file_is_ignored_with_a_warning_and_replaced(tmp_path, caplog, content):
    path = tmp_path / "kernel-times.json"
    path.write_text(content())
    os.chmod(path, 0o600)
    with caplog.at_level(logging.WARNING, logger="rewrite"):
        times = KernelTimes(str(path))
    assert times.times == {}
    assert "kernel times: ignoring" in caplog.text
    times.seconds(aten.mm.default, meta(4, 8), [meta(4, 8), meta(8, 8)])
    times.save()
    assert len(KernelTimes(str(path)).times) == 1


def test_a_symlink_or_another_users_file_is_not_read(tmp_path, caplog):
    target = tmp_path / "elsewhere.json"
    target.write_text(_figures({MM: 5.0}))
    os.chmod(target, 0o600)
    assert KernelTimes(str(target)).times == {MM: 5.0}  # read as itself; not through a link, nor open to others
    link = tmp_path / "kernel-times.json"
    link.symlink_to(target)
    with caplog.at_level(logging.WARNING, logger="rewrite"):
        assert KernelTimes(str(link)).times == {}
    assert "ignoring" in caplog.text
    loose = tmp_path / "loose.json"
    loose.write_text(target.read_text())
    os.chmod(loose, 0o644)  # open to others: not private, so not trusted (the file `save` writes is 0600)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rewrite"):
        assert KernelTimes(str(loose)).times == {}
    assert "not private" in caplog.text


def test_the_environment_switch_turns_measuring_off(monkeypatch):
    monkeypatch.setenv(calibration.KERNEL_TIMES_ENV, "0")
    cal = calibration._with_kernel_times(FIXED)
    assert cal.kernel_times is None
    monkeypatch.delenv(calibration.KERNEL_TIMES_ENV)
    assert calibration._with_kernel_times(FIXED).kernel_times is not None


def test_graph_cost_uses_the_measured_kernels():
    from rewrite.ir import Graph

    g = Graph("g")
    x = g.placeholder("x", meta(8, 16))
    w = g.placeholder("w", meta(16, 16))
    y = g.call(aten.mm.default, (x, w), meta=meta(8, 16))
    g.set_output((y,))
    with calibration.use(dataclasses.replace(FIXED, kernel_times=Table(lambda t, m: 0.25))):
        assert graph_cost(g) == 0.25
