"""The calibrated cost model: its cache (stale or damaged files are measured again), the figures it
prices ops with, extraction following it, switching rules off by name, and the multi-pattern guard."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import sympy
import torch

import rewrite
from rewrite import cost, models
from rewrite.config import CompilerConfig, ConfigError
from rewrite.cost import DEFAULT, FiguresError, KernelTimes, Rate, calibration, machine, op_cost
from rewrite.ir import Graph, TensorMeta
from rewrite.optimizer import optimize
from rewrite.report import GraphReport
from rewrite.unit import CompileUnit

aten = torch.ops.aten
S = sympy.Integer


def meta(*shape, dtype=torch.float32):
    return TensorMeta(dtype, tuple(S(s) for s in shape))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder, and a quick micro-benchmark instead of the real one."""
    monkeypatch.setenv("REWRITE_CACHE_DIR", str(tmp_path))
    measure = calibration.measure
    monkeypatch.setattr(calibration, "measure", lambda quick=False: measure(quick=True))
    return tmp_path


def test_calibration_is_measured_once_cached_and_read_back(cache):
    cal, path = calibration.calibrate(quick=True)
    assert path and os.path.dirname(path) == str(cache) and cal.source == path
    again = calibration.load(path)
    assert again.families == cal.families and again.dtype_speed == cal.dtype_speed and again.threads == cal.threads
    assert set(cal.families) == set(cost.FAMILIES) and cal.families["gemm"].rate > 0
    assert calibration._load_or_measure().source == path  # read, not measured again


def _damage(path: str, how: str) -> None:
    doc = json.load(open(path))
    if how == "not json":
        open(path, "w").write("{not json")
    elif how == "nan rate":
        doc["calibration"]["families"]["gemm"]["rate"] = float("nan")
        open(path, "w").write(json.dumps(doc))
    elif how == "negative overhead":
        doc["calibration"]["families"]["copy"]["overhead_s"] = -1.0
        open(path, "w").write(json.dumps(doc))
    elif how == "missing family":
        del doc["calibration"]["families"]["attention"]
        open(path, "w").write(json.dumps(doc))
    elif how == "extra field":
        doc["calibration"]["command"] = "rm -rf /"
        open(path, "w").write(json.dumps(doc))
    elif how == "oversized":
        open(path, "w").write(" " * (machine.MAX_FILE_BYTES + 1))
    elif how == "symlink":
        target = path + ".elsewhere"
        os.replace(path, target)
        os.symlink(target, path)
    elif how == "stale torch":
        doc["key"]["torch"] = "1.0.0"
        open(path, "w").write(json.dumps(doc))


@pytest.mark.parametrize("how, field", [
    ("not json", "not JSON"), ("nan rate", "families.gemm.rate"), ("negative overhead", "families.copy.overhead_s"),
    ("missing family", "calibration.families"), ("extra field", "calibration must hold exactly"),
    ("oversized", "bytes"), ("symlink", "cannot open"), ("stale torch", "stale, measured for another torch"),
])
def test_damaged_or_stale_cache_is_refused_naming_the_field_and_measured_again(cache, how, field):
    _, path = calibration.calibrate(quick=True)
    _damage(path, how)
    with pytest.raises(FiguresError, match=field) as err:
        calibration.load(path)
    assert path in str(err.value)
    rebuilt = calibration._load_or_measure()
    assert rebuilt.source == path and not os.path.islink(path)
    assert calibration.load(path).families == rebuilt.families  # the file was replaced by a good one


def test_one_file_holds_the_rates_and_the_kernel_times_and_each_save_keeps_the_other(cache):
    _, path = calibration.calibrate(quick=True)
    times = KernelTimes(path)
    t = times.seconds(aten.mm.default, meta(8, 16), [meta(8, 16), meta(16, 16)])
    times.save()
    figures = machine.read(path)
    assert figures.calibration is not None and list(figures.kernel_times.values()) == [t]
    calibration.calibrate(quick=True)  # the rates measured again: the kernel times stay
    assert list(machine.read(path).kernel_times.values()) == [t]
    assert [f for f in os.listdir(cache) if not f.startswith(".")] == [os.path.basename(path)]


def test_a_file_an_older_rewrite_wrote_is_measured_again_never_an_error(cache):
    path = machine.cache_path()
    older = {"format": 2, "key": {**machine.cache_key(), "format": 2}, "measured_at": "2025-01-01 00:00:00",
             "calibration": DEFAULT.as_json()}  # the rates alone, as format 2 kept them
    with open(path, "w") as f:
        f.write(json.dumps(older))
    os.chmod(path, 0o600)
    with pytest.raises(FiguresError, match=f"format 2 is not {machine.FORMAT}"):
        calibration.load(path)
    rebuilt = calibration._load_or_measure()
    assert rebuilt.source == path and calibration.load(path).families == rebuilt.families


def test_cli_calibrate_writes_the_cache(tmp_path):
    env = dict(os.environ, REWRITE_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-m", "rewrite", "calibrate", "--quick"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "gemm" in out.stdout and "saved to" in out.stdout
    assert [f for f in os.listdir(tmp_path) if f.startswith("cost-model-")]


# -- pricing ---------------------------------------------------------------------------------------------

def test_op_costs_follow_the_calibration():
    mm = aten.mm.default
    small, large = (meta(32, 64), [meta(32, 64), meta(64, 64)]), (meta(256, 512), [meta(256, 512), meta(512, 512)])
    with calibration.use(DEFAULT):
        a, b = cost.op_cost(mm, *small), cost.op_cost(mm, *large)
        half = cost.op_cost(mm, meta(256, 512, dtype=torch.bfloat16),
                            [meta(256, 512, dtype=torch.bfloat16), meta(512, 512, dtype=torch.bfloat16)])
    assert DEFAULT.families["gemm"].overhead_s < a < b and half > b * 1.5  # bfloat16 GEMMs run at half speed
    slow = dataclasses.replace(DEFAULT, families={**DEFAULT.families, "gemm": Rate(1e-3, 1e9)})
    with calibration.use(slow):
        assert cost.op_cost(mm, *small) > 1e-3 and cost.family_of(mm) == "gemm"


def test_compile_time_terms_cost_nothing():
    g = Graph("frozen")
    x = g.placeholder("x", meta(8, 64))
    w = g.constant(torch.randn(64, 64))
    w.attrs["weight_name"] = "w"
    t = g.call(aten.permute.default, (w, [1, 0]), meta=meta(64, 64))
    scaled = g.call(aten.mul.Tensor, (t, 0.5), meta=meta(64, 64))
    g.set_output((g.call(aten.mm.default, (x, scaled), meta=meta(8, 64)),))
    with calibration.use(DEFAULT):
        total = cost.graph_cost(g)
        assert total == pytest.approx(cost.op_cost(aten.mm.default, meta(8, 64), [meta(8, 64), meta(64, 64)]))


# -- extraction follows the cost model ----------------------------------------------------------------

def _qkv(n_siblings=3, width=64):
    g = Graph("qkv")
    x = g.placeholder("x", meta(32, width))
    outs = []
    for i in range(n_siblings):
        w, b = g.constant(torch.randn(width, width)), g.constant(torch.randn(width))
        w.attrs["weight_name"], b.attrs["weight_name"] = f"w{i}", f"b{i}"
        outs.append(g.call(aten.addmm.default, (b, x, w), meta=meta(32, width)))
    g.set_output(tuple(outs))
    return g


def _optimized(g, cal):
    report = GraphReport(g.name)
    with calibration.use(cal):
        return optimize(g, CompileUnit.detached(g.name, CompilerConfig(), report)), report


def test_merge_is_chosen_only_where_the_calibration_says_it_pays():
    # every GEMM kernel (ATen's, and oneDNN's linear on the frozen weights) dispatch-bound
    dispatch_bound = dataclasses.replace(DEFAULT, families={**DEFAULT.families, "gemm": Rate(50e-6, 100e9),
                                                            "fused_linear": Rate(50e-6, 100e9)})
    merged, report = _optimized(_qkv(), dispatch_bound)
    assert merged.op_counts().get("aten.addmm.default") == 1 and report.applied["merge_parallel_addmm_3"] == 3
    x = torch.randn(32, 64)
    from rewrite.testing import run_graph

    torch.testing.assert_close(run_graph(merged, [x]), run_graph(_qkv_like(merged), [x]), atol=1e-4, rtol=1e-4)
    # views (split) priced far above a GEMM call: keeping three GEMMs is cheaper, and extraction keeps them
    view_bound = dataclasses.replace(DEFAULT, view_s=1e-3)
    separate, report = _optimized(_qkv(), view_bound)
    assert separate.op_counts().get("aten.addmm.default") == 3 and report.applied.get("merge_parallel_addmm_3")


def _qkv_like(merged: Graph) -> Graph:
    """The unmerged graph with the same weights as ``merged`` (which folded them into one)."""
    tensors = [n.value for n in merged.nodes if n.kind == "constant" and isinstance(n.value, torch.Tensor)]
    wide, bias = next(t for t in tensors if t.dim() == 2), next(t for t in tensors if t.dim() == 1)
    g = Graph("ref")
    x = g.placeholder("x", meta(32, 64))
    outs = [g.call(aten.addmm.default, (g.constant(bias[i * 64:(i + 1) * 64]), x, g.constant(wide[:, i * 64:(i + 1) * 64])),
                   meta=meta(32, 64)) for i in range(3)]
    g.set_output(tuple(outs))
    return g


def test_multi_pattern_merge_is_guarded_against_explosion():
    from rewrite.egraph import Limits, run_egraph
    from rewrite.optimizer import library_runs

    g = _qkv(n_siblings=8, width=16)
    report = GraphReport("siblings")
    with calibration.use(DEFAULT):
        out, changed = run_egraph(g, library_runs(), Limits(), report)
    pairs, triples = report.applied.get("merge_parallel_addmm_2", 0), report.applied.get("merge_parallel_addmm_3", 0)
    # one e-graph run: every pair and triple of original GEMMs once (each member unioned), merged GEMMs never
    assert (pairs, triples) == (2 * 28, 3 * 56) and not report.notes
    assert changed and out.op_counts()["aten.addmm.default"] < 8
    # later rounds see a merged GEMM as an original and merge again: eight GEMMs end as at most two
    final, _ = _optimized(_qkv(n_siblings=8, width=16), DEFAULT)
    assert final.op_counts()["aten.addmm.default"] <= 2


# -- switching rules off by name ------------------------------------------------------------------------

def test_disabled_names_rules_rulesets_or_families():
    for names in (["merge_parallel_addmm_3", "merge_parallel_addmm_2"], ["gemm.merge_parallel"], ["gemm"]):
        config = CompilerConfig()
        config.rules.disabled = names
        report = GraphReport("qkv")
        with calibration.use(DEFAULT):
            g = _qkv()
            out = optimize(g, CompileUnit.detached(g.name, config, report))
        assert not any(k.startswith("merge_parallel") for k in report.applied), names
        assert out.op_counts()["aten.addmm.default"] == 3


def test_unknown_disabled_name_is_a_config_error_listing_the_known_ones():
    config = CompilerConfig()
    config.rules.disabled = ["merge_parallel_addm_3"]
    with pytest.raises(ConfigError, match=r"merge_parallel_addm_3.*families: \[.*'algebra'.*'gemm'.*"
                                          r"rulesets: \[.*'gemm.merge_parallel'.*close: \[.*'merge_parallel_addmm_3'"):
        g = _qkv()
        optimize(g, CompileUnit.detached(g.name, config, GraphReport("qkv")))
    model = torch.nn.Linear(4, 4)
    with pytest.raises(Exception, match="no rule family, ruleset or rule"):  # at compile time at the latest
        torch.compile(model, backend=rewrite.get_backend(config))(torch.randn(2, 4))


def test_explain_prints_the_predicted_cost_before_and_after():
    config = CompilerConfig()
    config.experimental_config.frozen_parameter = True
    with torch.no_grad(), calibration.use(DEFAULT):
        report = rewrite.explain(models.bert(), models.token_batch(1, 8), config=config)
    before, after = report.graphs[0].predicted_cost
    assert 0 < after < before
    assert f"predicted cost: {before * 1e6:.1f} us -> {after * 1e6:.1f} us" in str(report)


def test_an_op_without_a_static_kernel_pays_for_the_run_it_splits_where_graphs_run_static_kernels():
    from rewrite.cost.model import OUTSIDE_STATIC_KERNELS, RUN_SPLIT_DISPATCHES
    from rewrite.ops import FUSED_LINEARS

    if not FUSED_LINEARS:
        pytest.skip("this build has no oneDNN fused linear")
    linear = next(iter(FUSED_LINEARS))
    assert linear in OUTSIDE_STATIC_KERNELS
    x, w, b, out = meta(32, 64), meta(96, 64), meta(96), meta(32, 96)
    with calibration.use(DEFAULT):
        aten_code = (op_cost(linear, out, [x, w, b]), op_cost(aten.addmm.default, out, [b, x, meta(64, 96)]))
        with cost.for_static_kernels():
            static = (op_cost(linear, out, [x, w, b]), op_cost(aten.addmm.default, out, [b, x, meta(64, 96)]))
            with cost.for_static_kernels(False):  # blocks nest, and leave the pricing as they found it
                assert op_cost(linear, out, [x, w, b]) == aten_code[0]
            assert op_cost(linear, out, [x, w, b]) == static[0]
    assert static[0] == pytest.approx(aten_code[0] + RUN_SPLIT_DISPATCHES * DEFAULT.dispatch_s)
    assert static[1] == aten_code[1]  # the GEMM has a static kernel: priced alike


def test_a_symbolic_graph_keeps_the_gemm_its_gears_choose_at_their_own_sizes():
    """Whether oneDNN's linear pays depends on the sizes: with a symbolic size it is never chosen (a gear made
    from the graph could not undo it), at static sizes the timed kernels decide."""
    from rewrite.cost.model import AT_STATIC_SHAPES_ONLY_S
    from rewrite.ops import FUSED_LINEARS

    if not FUSED_LINEARS:
        pytest.skip("this build has no oneDNN fused linear")
    linear = next(iter(FUSED_LINEARS))
    rows = sympy.Symbol("s0", positive=True, integer=True)
    x, w, b = TensorMeta(torch.float32, (rows, S(64))), meta(96, 64), meta(96)
    out = TensorMeta(torch.float32, (rows, S(96)))
    # a machine where oneDNN's linear is far faster than the GEMM, at any size
    onednn_fast = dataclasses.replace(DEFAULT, families={**DEFAULT.families, "fused_linear": Rate(1e-7, 1e13)})
    with calibration.use(onednn_fast):
        assert op_cost(linear, meta(32, 96), [meta(32, 64), w, b]) < op_cost(aten.addmm.default, meta(32, 96),
                                                                             [b, meta(32, 64), meta(64, 96)])
        assert op_cost(linear, out, [x, w, b]) == AT_STATIC_SHAPES_ONLY_S
        assert op_cost(aten.addmm.default, out, [b, x, meta(64, 96)]) < AT_STATIC_SHAPES_ONLY_S / 1000
        g = Graph("symbolic_linear")
        xs = g.placeholder("x", x)
        y = g.call(aten.addmm.default, (g.constant(torch.randn(96)), xs, g.constant(torch.randn(64, 96))), meta=out)
        g.set_output((y,))
        got = optimize(g, CompileUnit.detached(g.name, CompilerConfig()))
    assert got.op_counts().get("aten.addmm.default") == 1 and not any(
        n.target in FUSED_LINEARS for n in got.nodes if n.kind == "call")
