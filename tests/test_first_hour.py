"""A newcomer's first hour (issue 30): quiet logs, explain of a compiled model, names the README uses,
the DSL's overload trap, reports that say what they count, optional extras named."""
from __future__ import annotations

import glob
import importlib
import os
import re
import subprocess
import sys
import textwrap
import tomllib

import pytest
import torch

import rewrite
from rewrite.dsl import RuleError, aten, rule, variables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1"}
MANUALS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))  # what the README links for everything else


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env={**ENV, **env}, cwd=ROOT)


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()


# ---- 1. logs -------------------------------------------------------------------------------------

def test_info_logging_of_a_small_compile_shows_rewrites_report_not_egglogs_internals():
    done = run_python("""
        import logging, torch, rewrite
        logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s: %(message)s")
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
        with torch.no_grad():
            torch.compile(m, backend=rewrite.get_backend(rewrite.CompilerConfig()), fullgraph=True)(torch.randn(4, 8))
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    assert len(lines) < 300, f"{len(lines)} log lines; first: {lines[:5]}"  # was ~19,000 egglog lines
    assert any(line.startswith("rewrite INFO: graph ") for line in lines), lines[:20]  # the report
    assert not any(line.startswith("egglog") for line in lines)


def test_cli_vv_turns_egglogs_loggers_back_on():
    done = run_python("""
        import logging
        from rewrite.cli import main
        levels = []
        for argv in (["-v", "rules"], ["-vv", "rules"]):
            main(argv)
            levels.append(logging.getLogger("egglog").level)
        print("LEVELS", levels)
    """)
    assert "LEVELS [30, 20]" in done.stdout, done.stderr[-2000:]


# ---- 2. explain of a compiled model ---------------------------------------------------------------

def test_explain_of_a_compiled_model_uses_its_backends_config():
    m = mlp()
    x = torch.randn(4, 8)

    def times_one(t):
        return m(t) * 1

    assert "mul_one" in rewrite.explain(times_one, x).applied()  # the default config fires it
    config = rewrite.CompilerConfig()
    config.rules.disabled = ["mul_one"]
    for compiled in (torch.compile(times_one, backend=rewrite.get_backend(config=config)),
                     torch.compile(times_one, backend="rewrite", options={"rules.disabled": ["mul_one"]})):
        report = rewrite.explain(compiled, x)
        assert "mul_one" not in report.applied(), report
        torch.testing.assert_close(report.result, times_one(x))
    # config= overrides the compiled model's config
    assert "mul_one" in rewrite.explain(compiled, x, config=rewrite.CompilerConfig()).applied()


def test_explain_of_a_model_compiled_by_another_backend_asks_for_config():
    compiled = torch.compile(mlp(), backend="eager")
    with pytest.raises(rewrite.ConfigError, match=r"backend 'eager'.*config=rewrite.CompilerConfig\(\)"):
        rewrite.explain(compiled, torch.randn(2, 8))
    assert rewrite.explain(compiled, torch.randn(2, 8), config=rewrite.CompilerConfig()).graphs


# ---- 3. names the README uses ---------------------------------------------------------------------

def readme_names(paths=(os.path.join(ROOT, "README.md"),)) -> set[str]:
    text = "\n".join(open(path).read() for path in paths)
    text = re.sub(r'"rewrite\.[\w.]*"', "", text)  # a string value such as a file's "rewrite.export.manifest" tag
    return set(re.findall(r"\brewrite\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)", text))


def test_every_rewrite_name_the_readme_uses_resolves():
    names = readme_names()
    assert {"GearError", "get_backend", "explain", "testing.check_fx_pass", "inference.set_dim_gears"} <= names
    unresolved = []
    for dotted in sorted(names | readme_names(MANUALS)):  # the manuals' names too
        obj, parts = rewrite, dotted.split(".")
        for i, part in enumerate(parts):
            if part in ("py", "md", "toml") or isinstance(obj, (str, int)):
                break  # a file name such as rewrite/ir.py spelt as rewrite.ir.py
            try:
                obj = getattr(obj, part)
            except AttributeError:
                try:  # a submodule imported by name (`import rewrite.compat.torchair as torchair`)
                    obj = importlib.import_module("rewrite." + ".".join(parts[:i + 1]))
                except ImportError:
                    unresolved.append(dotted)
                    break
    assert not unresolved, f"README (or docs/) names that do not resolve: {unresolved}"
    assert issubclass(rewrite.GearError, ValueError) and rewrite.GearError is rewrite.gears.GearError


def test_readme_points_at_files_in_the_repository():
    text = open(os.path.join(ROOT, "README.md")).read()
    assert "../shared" not in text
    for path in re.findall(r"\]\(((?:docs|benchmarks)/[^)#]+)", text) + ["docs/design.md"]:
        assert os.path.exists(os.path.join(ROOT, path)), path
    assert "seed 002" not in text or "docs/design.md" in text
    for doc in [os.path.join(ROOT, "README.md")] + MANUALS:  # every relative link, and the heading it names
        text = open(doc).read()
        assert "../shared" not in text, doc
        for path, anchor in re.findall(r"\]\(([^)#:\s]+)(?:#([^)]+))?\)", text):
            target = os.path.join(os.path.dirname(doc), path)
            assert os.path.exists(target), (doc, path)
            if anchor:
                headings = re.findall(r"^#+ (.+)$", open(target).read(), re.M)
                slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
                assert anchor in slugs, (doc, path, anchor)


def test_npugraph_ex_backend_name_works_after_import_rewrite_through_the_entry_point(tmp_path):
    # pyproject.toml's entry point, installed as pip would (a dist-info folder on the path), found by Dynamo.
    eps = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]["entry-points"]
    value = eps["torch_dynamo_backends"]["npugraph_ex"]
    info = tmp_path / "rewrite_entry_points-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rewrite-entry-points\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[torch_dynamo_backends]\nnpugraph_ex = {value}\n")
    done = run_python("""
        import sys, torch, rewrite
        m = torch.nn.Linear(8, 4).eval()
        x = torch.randn(2, 8)
        with torch.no_grad():
            out = torch.compile(m, backend="npugraph_ex", options={"capture_limit": 4})(x)
            torch.testing.assert_close(out, m(x))  # frozen weights: oneDNN's GEMM may round otherwise than eager's
        import rewrite.compat.torchair  # registering again on import is harmless
        print("OK")
    """, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}")
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]


def test_backend_names_work_from_a_checkout_that_is_not_installed():
    """A checkout on PYTHONPATH has no entry points (no dist-info): ``import rewrite`` gives Dynamo both names.
    (A GPU machine ran the checkout so, and ``CompileConfig(backend="rewrite")`` failed with InvalidBackend.)"""
    done = run_python("""
        import importlib.metadata as metadata, sys
        installed = metadata.entry_points
        def entry_points(**select):  # as where rewrite is not installed: no entry point of ours
            found = installed(**select)
            return type(found)(ep for ep in found if not ep.value.startswith("rewrite."))
        metadata.entry_points = entry_points
        import torch, rewrite
        dynamo_after_import = "torch._dynamo" in sys.modules
        x = torch.randn(2, 8)
        m = torch.nn.Linear(8, 4).eval()
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(torch.sin, backend="rewrite", mode="reduce-overhead")(x),
                                       torch.sin(x))
            torch.testing.assert_close(torch.compile(m, backend="npugraph_ex")(x), m(x))
        import rewrite.compat.torchair  # registers npugraph_ex on import: harmless after the checkout's names
        print("OK", dynamo_after_import)
    """)
    assert done.returncode == 0 and "OK True" in done.stdout, done.stderr[-3000:]
    installed = run_python("import sys, rewrite; print('dynamo', 'torch._dynamo' in sys.modules)")
    assert "dynamo False" in installed.stdout, installed.stderr[-3000:]  # installed: import rewrite stays cheap


@pytest.mark.parametrize("statement", ["config.dump_config.enable_dump = True", "config.aoe_config.aoe_mode = '2'",
                                       "config.debug.aclgraph.clone_input = True"])
def test_torchair_only_config_sections_raise_config_error(statement):
    config = rewrite.CompilerConfig()
    with pytest.raises(rewrite.ConfigError, match="TorchAir's .* which rewrite does not have"):
        exec(statement, {"config": config})
    assert not hasattr(config, "dump_config") and getattr(config, "aoe_config", None) is None


def test_torchair_logger_and_keywords():
    import logging

    import rewrite.compat.torchair as torchair

    assert torchair.logger is logging.getLogger("rewrite")
    config = rewrite.CompilerConfig(mode="reduce-overhead", **{"inference_config.gear_fallback": "pad"})
    assert (config.mode, config.inference_config.gear_fallback) == ("reduce-overhead", "pad")
    with pytest.raises(rewrite.ConfigError, match="no field 'mod'"):
        rewrite.CompilerConfig(mod="reduce-overhead")
    assert rewrite.get_backend(config=config).config.mode == "reduce-overhead"
    assert rewrite.get_backend(compiler_config=config).config.mode == "reduce-overhead"
    assert rewrite.get_backend(config).config.mode == "reduce-overhead"
    with pytest.raises(TypeError, match="once"):
        rewrite.get_backend(config=config, compiler_config=config)


# ---- 4. gear traps -------------------------------------------------------------------------------

class _Double(torch.nn.Module):
    def forward(self, x):
        return x * 2 + 1


def _compiled(model):
    torch._dynamo.reset()
    return torch.compile(model, backend=rewrite.get_backend(rewrite.CompilerConfig()), fullgraph=True)


def test_a_mark_on_a_tensor_the_first_call_does_not_pass_is_reported(caplog):
    compiled = _compiled(_Double())
    marked, passed = torch.randn(4, 3), torch.randn(4, 3)
    rewrite.inference.set_dim_gears(marked, {0: [2, 4]})
    with caplog.at_level("WARNING", logger="rewrite"):
        torch.testing.assert_close(compiled(passed), passed * 2 + 1)
    assert "set_dim_gears: a tensor of shape [4, 3] has gears {0: (2, 4)}" in caplog.text
    assert "have no effect" in caplog.text


def test_a_first_call_whose_size_is_no_gear_raises_gear_error_and_the_gears_stay():
    from torch._dynamo.utils import counters

    compiled = _compiled(_Double())
    x = torch.randn(3, 3)
    rewrite.inference.set_dim_gears(x, {0: [2, 4]})
    counters.clear()
    with pytest.raises(rewrite.GearError, match=r"input x dim 0 has size 3; allowed gears for it: \[2, 4\]"):
        compiled(x)  # was BackendCompilerFailed, which `except GearError` missed
    for rows in (2, 4):
        y = torch.randn(rows, 3)
        torch.testing.assert_close(compiled(y), y * 2 + 1)
    with pytest.raises(rewrite.GearError, match="has size 5"):  # the gears stayed: not a silent retrace
        compiled(torch.randn(5, 3))
    assert counters["stats"]["unique_graphs"] == 1


def test_a_loaded_exports_errors_name_the_callers_argument_and_dim(tmp_path):
    x = torch.randn(4, 3)
    rewrite.inference.set_dim_gears(x, {0: [2, 4]})
    rewrite.dynamo_export(x, model=_Double(), export_path=str(tmp_path / "geared"), dynamic=True)
    runner = rewrite.load(str(tmp_path / "geared"))
    with pytest.raises(rewrite.GearError) as raised:
        runner(torch.randn(3, 3))
    assert "input x dim 0 has size 3" in str(raised.value) and "L[" not in str(raised.value)
    rewrite.dynamo_export(torch.randn(4, 3), model=_Double(), export_path=str(tmp_path / "plain"), dynamic=True)
    plain = rewrite.load(str(tmp_path / "plain"))
    with pytest.raises(rewrite.ExportError) as raised:
        plain(torch.randn(0, 3))
    assert str(raised.value).startswith("input x dim 0 is 0, outside the range the graph was exported for")


def test_load_of_the_json_file_says_how_to_call_it(tmp_path):
    rewrite.dynamo_export(torch.randn(4, 3), model=_Double(), export_path=str(tmp_path / "out"))
    with pytest.raises(rewrite.ExportError, match=re.escape("rewrite.load(") + ".*export_name='export'"):
        rewrite.load(str(tmp_path / "out" / "export.json"))


def test_a_numpy_input_is_named_by_kind_not_printed_whole(tmp_path):
    import numpy as np

    rewrite.dynamo_export(torch.randn(4, 3), model=_Double(), export_path=str(tmp_path / "out"))
    runner = rewrite.load(str(tmp_path / "out"))
    with pytest.raises(rewrite.ExportError) as raised:
        runner(np.arange(3000.0).reshape(1000, 3))
    message = str(raised.value)
    assert "numpy.ndarray float64[1000, 3]" in message and "torch.from_numpy" in message and len(message) < 300


# ---- 6. rule authoring --------------------------------------------------------------------------

def test_an_op_written_without_overload_gets_the_one_traced_graphs_use():
    x, = variables("x")
    assert rule(aten.mul(x, 1), x, name="mul_one_short").lhs.target is torch.ops.aten.mul.Tensor  # was mul.default
    assert aten.neg(x).target is torch.ops.aten.neg.default
    with pytest.raises(RuleError, match=r"aten.pow has several overloads .*name the one traced graphs use"):
        aten.pow(x, 2)


def test_a_rule_written_without_overload_fires_on_a_traced_graph():
    x, = variables("x")
    mine = rewrite.dsl.RuleSet("mine", [rule(aten.mul(x, 1), x, name="short_mul_one")])
    config = rewrite.CompilerConfig()
    config.rules.extra = [mine]
    config.rules.disabled = ["mul_one"]
    report = rewrite.explain(lambda t: torch.relu(t) * 1, torch.randn(4), config=config)
    assert report.applied().get("short_mul_one", 0) >= 1, report


def test_check_rules_prints_each_counterexample_once_and_no_zero_counts(tmp_path):
    (tmp_path / "bad_rules_first_hour.py").write_text(textwrap.dedent("""
        from rewrite.dsl import aten, rule, RuleSet, variables, is_float
        x, = variables("x")
        RULES = RuleSet("bad", [rule(aten.mul.Tensor(x, 0.0), aten.zeros_like.default(x), when=[is_float(x)],
                                     name="bad_mul_zero")])
    """))
    done = subprocess.run([sys.executable, "-m", "rewrite", "check-rules", "bad_rules_first_hour"], capture_output=True,
                          text=True, timeout=300, env={**ENV, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}, cwd=ROOT)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stdout.count("counterexample:") == 1, done.stdout
    assert "0 of 0" not in done.stdout and "bad_mul_zero: UNSOUND" in done.stdout


# ---- 7. reports and optional extras ---------------------------------------------------------------

def test_report_says_fired_and_kept_and_prices_cost_as_a_share():
    text = str(rewrite.explain(lambda t: torch.relu(t) * 1, torch.randn(4)))
    assert "fired: " in text and "applied:" not in text and "kept: " in text
    assert re.search(r"predicted cost: .* \(\d+% of the cost before\)", text), text
    assert not re.search(r"\(\d+\.\d+x\)", text)


def test_report_says_symbolic_sizes_were_priced_at_a_stand_in():
    from rewrite.cost import SYMBOL_SIZE

    text = str(rewrite.explain(lambda t: torch.relu(t) * 1, torch.randn(4, 3), config=rewrite.CompilerConfig()))
    assert "symbolic sizes" not in text  # static: nothing to say
    f = torch.compile(lambda t: torch.relu(t) * 1, backend=rewrite.get_backend(), dynamic=True)
    backend_report = rewrite.explain(f, torch.randn(5, 3))
    assert f"symbolic sizes priced as {SYMBOL_SIZE}" in str(backend_report), str(backend_report)


def test_testing_and_demo_without_the_test_extra_name_it():
    done = run_python("""
        import sys
        sys.modules["hypothesis"] = None      # as if not installed
        sys.modules["transformers"] = None
        import rewrite
        try:
            rewrite.testing
        except ModuleNotFoundError as e:
            print("TESTING:", e)
        from rewrite.cli import main
        print("RC", main(["demo", "--batches", "1"]))
    """)
    assert "TESTING: rewrite.testing needs 'hypothesis'" in done.stdout, done.stdout + done.stderr[-2000:]
    assert 'pip install "rewrite[test]"' in done.stdout
    assert "RC 2" in done.stdout and 'demo (MiniLM) needs \'transformers\'' in done.stderr
    assert 'pip install "rewrite[test]"' in done.stderr
