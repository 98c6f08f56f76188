"""Defaults are tested (issue 24): every public entry point called with only its required arguments,
from a temporary working directory, checked against eager and against where the docs say the
files go (``export_file/`` for dynamo_export, ``.rewrite_cache/`` for cache_compile, the per-user
cache folder for calibrate), and the files loaded and run the way the docs say.

Entry points: rewrite.get_backend, rewrite.CompilerConfig (every default in docs/config.md's Config
table), rewrite.explain, rewrite.dynamo_export, rewrite.load, rewrite.inference.set_dim_gears,
rewrite.inference.cache_compile, every `python -m rewrite` subcommand (`CLI_TESTS`, checked against
the parser's list), and every name of `rewrite.compat.torchair` (`COMPAT_TESTS`, checked against
the module's `__all__` and its namespaces).
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import rewrite
from rewrite.cache import counters

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DOC = os.path.join(ROOT, "docs", "config.md")  # the README links it


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()


def _x(batch=4):
    return torch.randn(batch, 8, generator=torch.Generator().manual_seed(1))


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _files(folder) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)


def _python(script: str, cwd, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    path = cwd / "script.py"
    path.write_text(textwrap.dedent(script))
    full_env = {**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1", **(env or {})}
    out = subprocess.run([sys.executable, str(path)], cwd=str(cwd), env=full_env, capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out


def _cli(args: list[str], cwd, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "rewrite", *args], cwd=str(cwd), env=full_env, capture_output=True,
                          text=True, timeout=timeout)


# -- CompilerConfig: every default the Config table (docs/config.md) states --------------------------

def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _readme_config_defaults() -> dict:
    """{dotted field: default} from docs/config.md's table (`a` / `.b` and `x` / `_y` name siblings)."""
    text = open(CONFIG_DOC, encoding="utf-8").read()
    text = text.split("\n| field | default | values |\n", 1)[1].split("\n\n", 1)[0]
    table = [line for line in text.splitlines() if line.startswith("| `")]
    assert table, "docs/config.md has no Config table"
    out = {}
    for row in table:
        fields_cell, default_cell = [c.strip() for c in row.strip("|").split("|")][:2]
        names, last = [], None
        for name in re.findall(r"`([^`]+)`", fields_cell):
            if name.startswith(".") and last:
                name = last.rsplit(".", 1)[0] + name
            elif name.startswith("_") and last:  # `..._kernel` / `_build_dir`
                name = last + name
            names.append(name)
            last = name
        sep = " / " if " / " in fields_cell else ", "
        defaults = [d.strip().strip("`") for d in default_cell.split(sep)]
        defaults = [re.sub(r"\s*s$", "", d) for d in defaults]  # "10 s"
        values = [ast.literal_eval(d) for d in defaults]
        if len(values) == 1:
            values = values * len(names)
        assert len(values) == len(names), row
        out.update(zip(names, values))
    return out


def test_compiler_config_defaults_are_the_readme_table():
    actual = _flatten(rewrite.CompilerConfig().as_dict())
    documented = _readme_config_defaults()
    assert set(documented) == set(actual), (
        f"docs/config.md Config table lacks {sorted(set(actual) - set(documented))}, "
        f"names fields that do not exist: {sorted(set(documented) - set(actual))}")
    for name, value in documented.items():
        assert actual[name] == value and type(actual[name]) in (type(value), float), (name, actual[name], value)
    with pytest.raises(rewrite.ConfigError):
        rewrite.CompilerConfig().no_such_field = 1


# -- get_backend / backend="rewrite" / explain --------------------------------------------------

def test_get_backend_default_equals_eager_through_tier_up(cwd):
    model, x = mlp(), _x()
    backend = rewrite.get_backend()
    assert backend.config.mode == "max-autotune" and backend.config.exec.tier_up_calls == 8
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with torch.no_grad():
        want = model(x)
        for _ in range(10):  # past the default tier-up (8 calls) into the execution plan
            torch.testing.assert_close(compiled(x), want)
    assert len(backend.report.graphs) == 1
    assert _files(cwd) == []  # nothing written in the working directory by default (graph_dump off)


def test_backend_name_rewrite(cwd):
    model, x = mlp(), _x()
    compiled = torch.compile(model, backend="rewrite")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    assert _files(cwd) == []


def test_explain_defaults(cwd):
    model, x = mlp(), _x()
    report = rewrite.explain(model, x)
    with torch.no_grad():
        torch.testing.assert_close(report.result, model(x))
    text = str(report)
    assert "aten.relu.default" in text and "time:" in text and "predicted cost" in text
    assert _files(cwd) == []


def test_stats_and_strict_defaults(cwd):
    """rewrite.stats on what torch.compile(backend="rewrite") returned: a static model past its tier-up takes no
    slow path; config.strict turns the one it would take (a recompile) into rewrite.SlowPathError."""
    model, x = mlp(), _x()
    compiled = torch.compile(model, backend="rewrite")
    with torch.no_grad():
        for _ in range(rewrite.CompilerConfig().exec.tier_up_calls + 2):
            torch.testing.assert_close(compiled(x), model(x))
    stats = rewrite.stats(compiled)
    assert stats.slow_paths == 0 and stats.recompiles == 0 and stats.pads == 0, stats
    torch._dynamo.reset()
    strict = torch.compile(model, backend="rewrite", options={"strict": True}, dynamic=False)
    with torch.no_grad():
        strict(x)
        with pytest.raises(rewrite.SlowPathError, match="recompile|retrace"):
            strict(_x(batch=3))
    assert _files(cwd) == []


# -- set_dim_gears -----------------------------------------------------------------------------

def test_set_dim_gears_defaults_one_compile_every_gear_equals_eager(cwd):
    model = mlp()
    inner = rewrite.get_backend()
    compiles = []

    def counting(gm, example_inputs):
        compiles.append(1)
        return inner(gm, example_inputs)

    compiled = torch.compile(model, backend=counting)
    x = _x(8)
    rewrite.inference.set_dim_gears(x, dim_gears={0: [1, 2, 4, 8]})
    assert {d: list(g) for d, g in rewrite.inference.get_dim_gears(x).items()} == {0: [1, 2, 4, 8]}
    with torch.no_grad():
        for batch in (8, 1, 2, 4, 8, 2):  # the first call gets the marked tensor itself
            part = x if batch == 8 else x[:batch]
            torch.testing.assert_close(compiled(part), model(part))
        assert len(compiles) == 1  # one trace serves every gear
        assert len(inner.report.graphs[0].gears) == 4
        assert rewrite.GearError is rewrite.inference.GearError  # the README's spelling
        with pytest.raises(rewrite.inference.GearError):  # default gear_fallback="error": 3 is no gear
            compiled(x[:3])


def test_input_guards_defaults_backend_by_name_serves_eager_values_and_counts_a_failed_check(cwd):
    # the documented spelling: backend="rewrite", dynamic=False, the filter as torch.compile's option
    model = mlp()
    compiled = torch.compile(model, backend="rewrite", dynamic=False,
                             options={"guard_filter_fn": rewrite.inference.input_guards})
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(_x(4)), model(_x(4)))
        assert rewrite.stats(compiled).recompiles == 0
        torch.testing.assert_close(compiled(_x(2)), model(_x(2)))  # a kept check (the static size) fails
        assert rewrite.stats(compiled).recompiles == 1
    assert _files(cwd) == []  # nothing written into the working directory


# -- rewrite.scope ------------------------------------------------------------------------------

def _scoped(x, w):
    a = x + 1
    with rewrite.scope.stream_switch("1"):  # default priority 0
        b = x * 2
        rewrite.scope.wait_tensor(b, a)
        c = torch.mm(b, w)
        token = rewrite.scope.record()
    rewrite.scope.wait([token])
    return c + a


def test_scope_defaults_compiled_equals_eager(cwd):
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    compiled = torch.compile(_scoped, backend=rewrite.get_backend(), fullgraph=True)
    want = torch.mm(x * 2, w) + x + 1
    torch.testing.assert_close(_scoped(x, w), want)  # eager: the markers do nothing
    torch.testing.assert_close(compiled(x, w), want)
    assert _files(cwd) == []


# -- dynamo_export / load ------------------------------------------------------------------------

def test_dynamo_export_defaults_write_export_file_and_load_runs_it(cwd):
    model, x = mlp(), _x()
    path = rewrite.dynamo_export(x, model=model)
    assert os.path.isfile(cwd / "export_file" / "export.json")
    assert os.path.abspath(path) == str(cwd / "export_file" / "export.json") or path == os.path.join(
        "export_file", "export.json")
    runner = rewrite.load()  # default: ./export_file
    with torch.no_grad():
        got = runner(x)
        got = got[0] if isinstance(got, (tuple, list)) else got
        torch.testing.assert_close(got, model(x))
        with pytest.raises(rewrite.ExportError, match="expects dtype"):  # the top-level name of load's errors
            runner(x.double())
    # docs/export.md: the files run in a fresh process without Dynamo or the model's code.
    torch.save(x, cwd / "x.pt")
    torch.save(model(x).detach(), cwd / "want.pt")
    out = _python('''
        import sys, torch, rewrite
        runner = rewrite.load("export_file")
        got = runner(torch.load("x.pt"))
        got = got[0] if isinstance(got, (tuple, list)) else got
        torch.testing.assert_close(got, torch.load("want.pt"))
        print("dynamo imported:", "torch._dynamo" in sys.modules)
    ''', cwd)
    assert "dynamo imported: False" in out.stdout


# -- cache_compile ------------------------------------------------------------------------------

CACHE_SCRIPT = '''
    import json, sys, torch, rewrite
    from rewrite.cache import counters

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a = torch.nn.Linear(8, 16)
            self.b = torch.nn.Linear(16, 4)
            self.cached_forward = rewrite.inference.cache_compile(self.inner_forward)

        def inner_forward(self, x):
            return self.b(torch.relu(self.a(x)))

        def forward(self, x):
            return self.cached_forward(x)

    model = Model().eval()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        equal = [torch.equal(model(x), model.inner_forward(x)) or
                 torch.allclose(model(x), model.inner_forward(x), atol=1e-6) for _ in range(3)]
    print(json.dumps({"equal": equal, "counters": dict(counters), "dynamo": "torch._dynamo" in sys.modules}))
'''


def test_cache_compile_defaults_write_rewrite_cache_and_a_fresh_process_hits(cwd):
    first = json.loads(_python(CACHE_SCRIPT, cwd).stdout.strip().splitlines()[-1])
    assert first["equal"] == [True, True, True]
    assert first["counters"].get("misses") == 1 and first["counters"].get("writes") == 1
    assert first["counters"].get("traced") == 1  # three calls, one trace
    entry = cwd / ".rewrite_cache" / "Model" / "inner_forward"
    assert {"program.json", "key.json", "signature.json", "live.json"} <= set(os.listdir(entry))
    second = json.loads(_python(CACHE_SCRIPT, cwd).stdout.strip().splitlines()[-1])
    assert second["equal"] == [True, True, True]
    assert second["counters"] == {"hits": 1}  # no miss, no trace, no write
    assert second["dynamo"] is False  # docs/cache.md: a later process skips Dynamo too


class Geared(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 8)
        self.cached_forward = rewrite.inference.cache_compile(self.inner_forward)

    def inner_forward(self, x):
        return torch.relu(self.a(x)) + 1

    def forward(self, x):
        return self.cached_forward(x)


def test_cache_compile_with_gears_compiles_once(cwd):
    model = Geared().eval()
    x = _x(4)
    rewrite.inference.set_dim_gears(x, dim_gears={0: [2, 4]})
    before = dict(counters)
    with torch.no_grad():
        for part in (x, x[:2], x, x[:2], x[:4]):  # the first call gets the marked tensor
            torch.testing.assert_close(model(part), model.inner_forward(part))
    new = {k: counters[k] - before.get(k, 0) for k in counters}
    assert new.get("misses", 0) == 1 and new.get("traced", 0) == 1, new
    assert os.path.isdir(cwd / ".rewrite_cache" / "Geared" / "inner_forward")


# -- the CLI: every subcommand with only its required arguments ---------------------------------

def _subcommands() -> set[str]:
    out = _cli(["--help"], ROOT, timeout=120)
    assert out.returncode == 0
    (choices,) = re.findall(r"\{([\w,-]+)\}", out.stdout)[:1]
    return set(choices.split(","))


def cli_demo(tmp_path):
    # Its only arguments are optional; the defaults (4 gears, sequence 32, three modes) take minutes,
    # so this runs one small gear. `make demo` runs the defaults.
    out = _cli(["demo", "--batches", "2", "--seq", "8"], tmp_path, timeout=400)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "every gear of every mode matches eager" in out.stdout and "recompiles after the first calls: 0" in out.stdout


def cli_rules(tmp_path):
    out = _cli(["rules"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    from rewrite.optimizer import describe_schedule

    assert out.stdout.strip() == describe_schedule().strip()


def cli_check_rules(tmp_path):
    (tmp_path / "myrules.py").write_text(textwrap.dedent('''
        from rewrite.dsl import aten, rule, RuleSet, variables, value_is
        x, c = variables("x c")
        mine = RuleSet("mine", [rule(aten.mul.Tensor(x, c), x, when=[value_is(c, 1)], name="mul_one")])
    '''))
    out = _cli(["check-rules", "myrules"], tmp_path)  # found in the cwd
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "mul_one" in out.stdout


def cli_calibrate(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "REWRITE_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    out = subprocess.run([sys.executable, "-m", "rewrite", "calibrate"], cwd=str(tmp_path), capture_output=True,
                         text=True, timeout=300, env={**env, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr[-3000:]
    saved = re.search(r"saved to (.+)", out.stdout)
    assert saved, out.stdout
    assert os.path.dirname(saved.group(1)) == str(tmp_path / "xdg" / "rewrite") and os.path.isfile(saved.group(1))


def cli_check_pass(tmp_path):
    (tmp_path / "mypasses.py").write_text(textwrap.dedent('''
        import torch
        aten = torch.ops.aten

        def double_neg(gm):                          # -(-x) -> a copy of x
            for node in list(gm.graph.find_nodes(op="call_function", target=aten.neg.default)):
                inner = node.args[0]
                if getattr(inner, "target", None) is aten.neg.default:
                    with gm.graph.inserting_before(node):
                        node.replace_all_uses_with(gm.graph.call_function(aten.clone.default, (inner.args[0],)))
                    gm.graph.erase_node(node)
    '''))
    out = _cli(["check-pass", "mypasses:double_neg"], tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "double_neg: ok on 200 random static graphs" in out.stdout


def cli_cache(tmp_path):
    _python(CACHE_SCRIPT, tmp_path)  # writes ./.rewrite_cache (cache_compile's default)
    ls = _cli(["cache", "ls"], tmp_path)  # default --dir: ./.rewrite_cache
    assert ls.returncode == 0, ls.stderr[-3000:]
    rows = [r for r in ls.stdout.splitlines() if r.strip()]
    assert len(rows) == 1 and rows[0].startswith(os.path.join("Model", "inner_forward")), ls.stdout
    info = _cli(["cache", "info", rows[0].split()[0]], tmp_path)
    assert info.returncode == 0 and '"kind"' in info.stdout, info.stdout + info.stderr
    clear = _cli(["cache", "clear"], tmp_path)
    assert clear.returncode == 0 and "removed 1 entries from .rewrite_cache" in clear.stdout, clear.stdout
    assert not os.path.isdir(tmp_path / ".rewrite_cache" / "Model" / "inner_forward")


def cli_check_backend(tmp_path):
    """Only what it needs: the function and its input shapes; the default backend is Inductor."""
    (tmp_path / "mymodule.py").write_text("def fn(x, y):\n    return x * 2 + (-y)\n")
    out = _cli(["check-backend", "mymodule:fn", "--shapes", "4,8", "4,8"], tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "check_backend: ok" in out.stdout and "inductor" in out.stdout, out.stdout[-2000:]
    assert not [f for f in os.listdir(tmp_path) if f not in ("mymodule.py", "__pycache__")]  # no repro files: no finding


CLI_TESTS = {
    "check-backend": cli_check_backend,
    "demo": cli_demo,
    "rules": cli_rules,
    "check-rules": cli_check_rules,
    "calibrate": cli_calibrate,
    "check-pass": cli_check_pass,
    "cache": cli_cache,
}


def test_every_cli_subcommand_is_tested():
    assert _subcommands() == set(CLI_TESTS)


@pytest.mark.parametrize("sub", sorted(CLI_TESTS))
def test_cli_subcommand_defaults(sub, tmp_path):
    CLI_TESTS[sub](tmp_path)


# -- rewrite.compat.torchair: every name ---------------------------------------------------------

torchair = pytest.importorskip("rewrite.compat.torchair")


def _compat_names() -> set[str]:
    names = set()
    for name in torchair.__all__:
        value = getattr(torchair, name)
        if isinstance(value, __import__("types").SimpleNamespace):
            names |= {f"{name}.{attr}" for attr in vars(value)}
        else:
            names.add(name)
    return names


def compat_compiler_config(cwd):
    assert torchair.CompilerConfig is rewrite.CompilerConfig
    assert torchair.CompilerConfig().as_dict() == rewrite.CompilerConfig().as_dict()


def compat_get_npu_backend(cwd):
    model, x = mlp(), _x()
    backend = torchair.get_npu_backend()
    assert isinstance(backend, torchair.NpuBackend) and backend.config.mode == "max-autotune"
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


def compat_npu_backend(cwd):
    model, x = mlp(), _x()
    compiled = torch.compile(model, backend=torchair.NpuBackend(), options={"frozen_parameter": True})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


def compat_npugraph_ex(cwd):
    model, x = mlp(), _x()
    compiled = torch.compile(model, backend="npugraph_ex")
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x))
    direct = torch.compile(model, backend=torchair.npugraph_ex)
    with torch.no_grad():
        torch.testing.assert_close(direct(x), model(x))


def compat_dynamo_export(cwd):
    model, x = mlp(), _x()
    torchair.dynamo_export(x, model=model)
    assert os.path.isfile(cwd / "export_file" / "export.json")
    out = rewrite.load("export_file")(x)
    with torch.no_grad():
        torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, model(x))


def compat_set_dim_gears(cwd):
    model, x = mlp(), _x(4)
    torchair.inference.set_dim_gears(x, dim_gears={0: [2, 4]})
    compiled = torch.compile(model, backend=torchair.get_npu_backend())
    with torch.no_grad():
        for part in (x, x[:2]):
            torch.testing.assert_close(compiled(part), model(part))


class CompatCached(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 4)
        self.cached = torchair.inference.cache_compile(self.prompt)

    def prompt(self, x):
        return self.a(x) * 2

    def forward(self, x):
        return self.cached(x)


def compat_cache_compile(cwd):
    model, x = CompatCached().eval(), _x()
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.prompt(x))
        torch.testing.assert_close(model(x), model.prompt(x))
    assert os.path.isfile(cwd / ".rewrite_cache" / "CompatCached" / "prompt" / "program.json")


def _streams(x, w):
    a = x + 1
    with torchair.scope.npu_stream_switch("1"):
        b = x * 2
        torchair.scope.npu_wait_tensor(b, a)
        c = torch.mm(b + a, w)
    return c - a


def compat_streams(cwd):
    assert torchair.scope.npu_stream_switch is rewrite.scope.stream_switch
    assert torchair.scope.npu_wait_tensor is rewrite.scope.wait_tensor
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    compiled = torch.compile(_streams, backend=torchair.get_npu_backend(), fullgraph=True)
    torch.testing.assert_close(compiled(x, w), _streams(x, w))
    torch.testing.assert_close(_streams(x, w), torch.mm(x * 2 + x + 1, w) - (x + 1))  # eager: a no-op


def _record_wait(x):
    a = x + 1
    with torchair.scope.npu_stream_switch("2"):
        b = a * 3
        token = torchair.ops.record()
    torchair.ops.wait([token])
    return a + b


def compat_record_wait(cwd):
    assert (torchair.ops.record, torchair.ops.wait) == (rewrite.scope.record, rewrite.scope.wait)
    x = torch.randn(4, 4)
    compiled = torch.compile(_record_wait, backend=torchair.get_npu_backend(), fullgraph=True)
    torch.testing.assert_close(compiled(x), (x + 1) * 4)


def compat_logger(cwd):
    # TorchAir scripts set its logger's level (torchair.logger.setLevel(logging.DEBUG)): here it is rewrite's
    import logging

    assert torchair.logger is logging.getLogger("rewrite")
    torchair.logger.setLevel(logging.INFO)
    try:
        assert logging.getLogger("rewrite").isEnabledFor(logging.INFO)
    finally:
        torchair.logger.setLevel(logging.NOTSET)


def _npu_only_scopes(x):
    with torchair.scope.super_kernel("sk"), torchair.scope.limit_core_num(4, 8), \
            torchair.scope.op_never_timeout(), torchair.scope.data_dump():
        y = torch.relu(x) + 1
    return y * 2


def compat_npu_only_scopes(cwd):
    x = torch.randn(4, 4)
    compiled = torch.compile(_npu_only_scopes, backend=torchair.get_npu_backend(), fullgraph=True)
    torch.testing.assert_close(compiled(x), (torch.relu(x) + 1) * 2)
    with pytest.raises(TypeError):
        torchair.scope.op_never_timeout(1)


COMPAT_TESTS = {
    "CompilerConfig": compat_compiler_config,
    "get_npu_backend": compat_get_npu_backend,
    "NpuBackend": compat_npu_backend,
    "npugraph_ex": compat_npugraph_ex,
    "dynamo_export": compat_dynamo_export,
    "inference.set_dim_gears": compat_set_dim_gears,
    "inference.cache_compile": compat_cache_compile,
    "scope.npu_stream_switch": compat_streams,
    "scope.npu_wait_tensor": compat_streams,
    "ops.record": compat_record_wait,
    "ops.wait": compat_record_wait,
    "scope.super_kernel": compat_npu_only_scopes,
    "scope.limit_core_num": compat_npu_only_scopes,
    "scope.op_never_timeout": compat_npu_only_scopes,
    "scope.data_dump": compat_npu_only_scopes,
    "logger": compat_logger,
}


def test_every_compat_name_is_tested():
    assert _compat_names() == set(COMPAT_TESTS)


@pytest.mark.parametrize("fn", sorted(set(COMPAT_TESTS.values()), key=lambda f: f.__name__),
                         ids=lambda f: f.__name__)
def test_compat_defaults(fn, cwd):
    fn(cwd)


# -- every public name is covered above -------------------------------------------------------------

PUBLIC_TESTS = {
    "get_backend": test_get_backend_default_equals_eager_through_tier_up,
    "CompilerConfig": test_compiler_config_defaults_are_the_readme_table,
    "ConfigError": test_compiler_config_defaults_are_the_readme_table,
    "explain": test_explain_defaults,
    "stats": test_stats_and_strict_defaults,
    "SlowPathError": test_stats_and_strict_defaults,
    "dynamo_export": test_dynamo_export_defaults_write_export_file_and_load_runs_it,
    "load": test_dynamo_export_defaults_write_export_file_and_load_runs_it,
    "ExportError": test_dynamo_export_defaults_write_export_file_and_load_runs_it,
    "inference.set_dim_gears": test_set_dim_gears_defaults_one_compile_every_gear_equals_eager,
    "inference.get_dim_gears": test_set_dim_gears_defaults_one_compile_every_gear_equals_eager,
    "inference.GearError": test_set_dim_gears_defaults_one_compile_every_gear_equals_eager,
    "GearError": test_set_dim_gears_defaults_one_compile_every_gear_equals_eager,
    "inference.cache_compile": test_cache_compile_defaults_write_rewrite_cache_and_a_fresh_process_hits,
    "inference.input_guards": test_input_guards_defaults_backend_by_name_serves_eager_values_and_counts_a_failed_check,
    "scope.stream_switch": test_scope_defaults_compiled_equals_eager,
    "scope.wait_tensor": test_scope_defaults_compiled_equals_eager,
    "scope.record": test_scope_defaults_compiled_equals_eager,
    "scope.wait": test_scope_defaults_compiled_equals_eager,
}
NOT_ENTRY_POINTS = {
    "CompileError": "an exception class (raised, not called)",
    "scope.StreamScopeError": "an exception class (raised, not called)",
    "scope.annotate_streams": "the backend's pass over the IR (takes a rewrite.ir.Graph), not a user call",
}


def test_every_public_name_is_tested():
    names = set()
    for name in rewrite.__all__:
        value = getattr(rewrite, name)
        if isinstance(value, type(rewrite)):
            names |= {f"{name}.{sub}" for sub in value.__all__}
        else:
            names.add(name)
    assert names == set(PUBLIC_TESTS) | set(NOT_ENTRY_POINTS)
