"""The README is executable (issue 24): every ```python block of README.md and docs/*.md runs, and
every `python -m rewrite ...` subcommand the documentation shows runs, each from a fresh temporary
working directory. A documented example that does not work fails here.

Markers (an HTML comment, invisible when rendered, on the line directly before a fence):

    <!-- readme-test: skip (REASON) -->        the block is not run; REASON is required and says why
                                               (needs CUDA, takes minutes, ...). Keep these few.
    <!-- readme-test: continue -->              the block runs in the namespace and working directory of
                                               the previous ```python block of the same file (for an
                                               example split by prose)
    <!-- readme-test: raises NAME[: TEXT] -->   the block must raise exception NAME (a builtin or a name
                                               in `rewrite`), whose message contains TEXT when given;
                                               what the block defined before the raise stays defined
                                               for a following `continue` block

A marker that is not directly before a fence, or that this file does not know, fails
`test_markers_are_attached_and_known`.

Stand-ins (`STAND_INS`): README blocks are fragments of a user's script, so a block that uses one of
these names without defining it gets a small stand-in (each session runs the stand-ins first, and
the block's own definitions replace them):

    model, m, model_or_fn   a 2-layer MLP (8 -> 16 -> 4, ReLU), eval mode
    x                       a float32 batch of 4 rows for it; example_args = (x,)
    input_ids               int64 tokens, shape (8, 16) (the largest gear the gears blocks name)
    a, b, w                 4x4 float32 tensors (the streams block)
    config                  rewrite.CompilerConfig() (what the "Use" block makes)

After a session its results are checked against eager where the README promises a result
(`_check_results`): a `model` the block compiled equals the eager stand-in on `x`; a `runner` the
block loaded equals `m(x)` and its files are in the temporary cwd; gears the block set on
`input_ids` serve every gear with one compile of a stand-in embedding model under the block's
`config`; each `with ...stream_switch(...)` statement, made a function of the stand-ins it reads,
gives under torch.compile (the block's `config`) what it gives in eager; a `config` the block
changed compiles the stand-in MLP (past the tier-up) to eager's values. Absolute folders a block
puts into `config` ("/path", "/var/cache/rewrite") are redirected under the temporary cwd first.

CLI (```bash blocks and inline `python -m rewrite SUB ...` mentions): each line of a ```bash block
is run unless the block is skipped; every subcommand the documentation mentions must have a
runner in `CLI_RUNNERS` (a test below with small concrete arguments standing in for the README's
placeholders such as MODULE or mypasses:my_pass), so a newly documented command cannot go untested.
"""
from __future__ import annotations

import ast
import builtins
import glob
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field

import pytest
import torch

import rewrite

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))

MARKER = re.compile(r"^<!--\s*readme-test:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
KNOWN_MARKERS = re.compile(r"^(skip \(.+\)|continue|raises [A-Za-z_][\w.]*(: .+)?)$")


@dataclass
class Block:
    path: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{os.path.relpath(self.path, ROOT)}:{self.line}"


@dataclass
class Session:
    blocks: list = field(default_factory=list)

    @property
    def where(self) -> str:
        return self.blocks[0].where


def parse_blocks(path: str) -> list[Block]:
    lines = open(path, encoding="utf-8").read().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        start = i
        i += 1
        body = []
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        marker = MARKER.match(lines[start - 1]) if start else None
        blocks.append(Block(path, start + 1, fence.group(1), "\n".join(body) + "\n",
                            marker.group(1) if marker else None))
        i += 1
    return blocks


def all_blocks() -> list[Block]:
    return [b for path in DOCS for b in parse_blocks(path)]


def python_sessions() -> list[Session]:
    sessions: list[Session] = []
    for path in DOCS:
        for block in parse_blocks(path):
            if block.lang != "python":
                continue
            if block.marker == "continue":
                assert sessions and sessions[-1].blocks[0].path == path, f"{block.where}: nothing to continue"
                sessions[-1].blocks.append(block)
            else:
                sessions.append(Session([block]))
    return sessions


def _skip_reason(block: Block) -> str | None:
    if block.marker and block.marker.startswith("skip"):
        return block.marker[len("skip ("):-1]
    return None


# -- stand-ins --------------------------------------------------------------------------------------

STAND_INS = '''
import torch, rewrite
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
m = model_or_fn = model
x = torch.randn(4, 8)
example_args = (x,)
input_ids = torch.randint(0, 100, (8, 16))
a, b, w = torch.randn(4, 4), torch.randn(4, 4), torch.randn(4, 4)
config = rewrite.CompilerConfig()
'''


def _exception_class(name: str):
    if hasattr(builtins, name):
        return getattr(builtins, name)
    obj = rewrite
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _run_block(block: Block, ns: dict) -> None:
    code = compile(block.code, block.where, "exec")
    if block.marker and block.marker.startswith("raises "):
        spec = block.marker[len("raises "):]
        name, _, text = spec.partition(": ")
        with pytest.raises(_exception_class(name)) as info:
            exec(code, ns)
        assert text in str(info.value), f"{block.where}: expected {text!r} in:\n{info.value}"
    else:
        exec(code, ns)


def _compiled_equals_eager(fn, args, config, calls: int = 3) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=rewrite.get_backend(compiler_config=config), fullgraph=True)
    with torch.no_grad():
        want = fn(*args)
        for _ in range(calls):
            torch.testing.assert_close(compiled(*args), want)


def _scoped_functions(session: Session, stand: dict) -> list:
    """Each top-level `with ...stream_switch(...)` statement of the session as a function of the
    stand-ins it reads, returning what it assigns (so it can run under torch.compile)."""
    out = []
    for block in session.blocks:
        for node in ast.parse(block.code).body:
            if not (isinstance(node, ast.With) and "stream_switch" in ast.unparse(node.items[0])):
                continue
            names = [n for n in ast.walk(node) if isinstance(n, ast.Name)]
            params = sorted({n.id for n in names if isinstance(n.ctx, ast.Load) and n.id in stand
                             and isinstance(stand[n.id], torch.Tensor)})
            outputs = sorted({n.id for n in names if isinstance(n.ctx, ast.Store)})
            src = (f"def _scoped({', '.join(params)}):\n" + textwrap.indent(ast.unparse(node), "    ")
                   + f"\n    return ({', '.join(outputs)},)\n")
            scope = {"torch": torch, "rewrite": rewrite}
            exec(compile(src, block.where, "exec"), scope)
            out.append((scope["_scoped"], [stand[p] for p in params]))
    return out


def _check_results(session: Session, ns: dict, stand: dict, cwd) -> list[str]:
    """What the session promises, against eager; returns the names of the checks that ran.

    Absolute folders a block put into `config` (placeholders such as "/path" or "/var/cache/rewrite")
    are replaced by folders under the temporary cwd before anything compiles, so the test never
    writes outside it.
    """
    ran = []
    eager, x = stand["model"], stand["x"]
    if ns.get("model") is not stand["model"] and isinstance(ns.get("model"), torch.nn.Module):
        with torch.no_grad():
            torch.testing.assert_close(ns["model"](x), eager(x))
        ran.append("compiled model == eager")
    if "runner" in ns:
        with torch.no_grad():
            got = ns["runner"](ns.get("x", x))
            got = got[0] if isinstance(got, (tuple, list)) else got
            torch.testing.assert_close(got, ns["m"](ns.get("x", x)))
        export_dirs = re.findall(r'export_path="([^"]+)"', "".join(b.code for b in session.blocks))
        for d in export_dirs or ["export_file"]:
            assert (cwd / d).is_dir(), f"{d} not written in the working directory"
        ran.append("loaded export == eager")
    config = ns.get("config")
    if not isinstance(config, rewrite.CompilerConfig):
        return ran
    kernels = config.experimental_config.aclgraph
    if kernels._aclnn_static_shape_kernel_build_dir and os.path.isabs(kernels._aclnn_static_shape_kernel_build_dir):
        os.makedirs(cwd / "kernels-build")
        kernels._aclnn_static_shape_kernel_build_dir = str(cwd / "kernels-build")
    if config.cache.dir and os.path.isabs(config.cache.dir):
        config.cache.dir = str(cwd / "cache-dir")
    ids = ns.get("input_ids")
    gears = rewrite.inference.get_dim_gears(ids) if isinstance(ids, torch.Tensor) else {}
    if gears:
        torch._dynamo.reset()
        torch.manual_seed(0)
        embed = torch.nn.Sequential(torch.nn.Embedding(100, 8), torch.nn.Linear(8, 4)).eval()
        inner = rewrite.get_backend(compiler_config=config)
        compiles = []

        def counting(gm, example_inputs):
            compiles.append(1)
            return inner(gm, example_inputs)

        fn = torch.compile(embed, backend=counting, fullgraph=True)
        (dim, sizes), = gears.items()
        with torch.no_grad():
            for size in [ids.shape[dim]] + list(sizes):
                part = ids.narrow(dim, 0, size) if size != ids.shape[dim] else ids
                torch.testing.assert_close(fn(part), embed(part))
        assert len(compiles) == 1, f"gears {gears} compiled {len(compiles)} times"
        ran.append("every gear == eager, one compile")
    for fn, args in _scoped_functions(session, stand):
        _compiled_equals_eager(fn, args, config)
        ran.append("stream scope compiled == eager")
    if config.as_dict() != rewrite.CompilerConfig().as_dict():
        calls = config.exec.tier_up_calls + 2 if config.mode == "max-autotune" else 3  # past the tier-up
        _compiled_equals_eager(eager, (x,), config, calls)
        ran.append("the block's config compiles the stand-in model == eager")
        if config.cache.dir:  # "optimized graphs and gear graphs are cached"
            from rewrite.cache.store import entries

            assert [rel for rel, record in entries(config.cache.dir) if isinstance(record, dict)], config.cache.dir
            ran.append("config.cache.dir holds the entry")
    return ran


SESSIONS = python_sessions()


def test_markers_are_attached_and_known():
    for path in DOCS:
        lines = open(path, encoding="utf-8").read().splitlines()
        for n, line in enumerate(lines):
            marker = MARKER.match(line)
            if "readme-test" in line:
                assert marker, f"{path}:{n + 1}: malformed marker {line!r}"
            if marker:
                assert KNOWN_MARKERS.match(marker.group(1)), f"{path}:{n + 1}: unknown marker {marker.group(1)!r}"
                assert n + 1 < len(lines) and FENCE.match(lines[n + 1]), \
                    f"{path}:{n + 1}: a readme-test marker must be on the line directly before a fence"
    skipped = [b for b in all_blocks() if _skip_reason(b)]
    assert len(skipped) <= 3, [b.where for b in skipped]  # keep skips rare; each has a reason
    assert len(SESSIONS) >= 9  # README: use, knobs; docs/: gears x2, streams, reduce-overhead, export, cache, rules x2, fx pass


@pytest.mark.parametrize("session", SESSIONS, ids=[s.where for s in SESSIONS])
def test_python_block_runs(session, tmp_path, monkeypatch):
    reason = _skip_reason(session.blocks[0])
    if reason:
        pytest.skip(reason)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("REWRITE_CACHE_DIR", str(tmp_path / ".cost-cache"))
    stand: dict = {}
    exec(STAND_INS, stand)
    ns = dict(stand)
    for block in session.blocks:
        _run_block(block, ns)
    checks = _check_results(session, ns, stand, tmp_path)
    print(session.where, "checked:", checks)


# -- the CLI ----------------------------------------------------------------------------------------

CLI_MENTION = re.compile(r"python -m rewrite ([a-z][\w-]*)")
MARKER_LINE = re.compile(r"^<!--\s*readme-test:.*-->\s*$", re.M)


def _cli(args: list[str], cwd, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "rewrite", *args], cwd=str(cwd), env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def _readme_python() -> list[str]:
    return [b.code for b in all_blocks() if b.lang == "python"]


def _readme_functions(prefix: str) -> str:
    """The source of the README's top-level functions named ``prefix*`` (the check_fx_pass examples)."""
    out = []
    for code in _readme_python():
        tree = ast.parse(code)
        out += [ast.get_source_segment(code, node) for node in tree.body
                if isinstance(node, ast.FunctionDef) and node.name.startswith(prefix)]
    return "\n\n".join(out)


def _readme_ruleset_module() -> str:
    """The Rules block (docs/rules.md) as a module: its imports and definitions (not the lines that use `config`)."""
    (code,) = [c for c in _readme_python() if "RuleSet(" in c]
    tree = ast.parse(code)
    keep = [ast.get_source_segment(code, node) for node in tree.body
            if "config" not in ast.get_source_segment(code, node) and "check_rule" not in ast.get_source_segment(code, node)]
    return "\n".join(keep) + "\n"


def cli_rules(tmp_path):
    out = _cli(["rules"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rules_doc = open(os.path.join(ROOT, "docs", "rules.md"), encoding="utf-8").read()
    table = rules_doc.split("\n## Rule families\n")[1].split("\n\n")[1]
    families = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", table, re.M)
    assert families, "docs/rules.md: no Rule families table"
    for family, sets in families:
        for name in re.findall(r"`(\w+)`", sets):
            assert f"{family}.{name}" in out.stdout, f"{family}.{name} (docs/rules.md, Rule families) not in `rules`"


def cli_check_rules(tmp_path):
    (tmp_path / "myrules.py").write_text(_readme_ruleset_module())
    out = _cli(["check-rules", "myrules"], tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "mul_one" in out.stdout
    missing = _cli(["check-rules", "no_such_rules_module"], tmp_path)
    assert missing.returncode == 2 and "no_such_rules_module" in missing.stderr


def cli_calibrate(tmp_path):
    cache = tmp_path / "cost-cache"
    env = {"REWRITE_CACHE_DIR": str(cache)}
    out = _cli(["calibrate"], tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    saved = re.search(r"saved to (.+)", out.stdout)
    assert saved and os.path.isfile(saved.group(1)) and saved.group(1).startswith(str(cache)), out.stdout
    shown = _cli(["calibrate", "--show"], tmp_path, env=env)
    assert shown.returncode == 0, shown.stderr[-3000:]
    # --show prints the cached figures: the same rows calibrate printed above (sorted by name)
    def rows(text):
        return sorted(", ".join(sorted(line.split(": ", 1)[-1].split(", "))) if "dtype speed" in line else line
                      for line in text.splitlines()[1:] if line.strip() and not line.startswith("saved to"))
    assert rows(shown.stdout) == rows(out.stdout), (out.stdout, shown.stdout)
    assert saved.group(1) in shown.stdout.splitlines()[0]


def cli_check_pass(tmp_path):
    passes = _readme_functions("fold_")
    assert "def fold_mul_zero" in passes and "def fold_int_mul_zero" in passes
    (tmp_path / "mypasses.py").write_text("import torch\naten = torch.ops.aten\n\n" + passes + textwrap.dedent('''

        my_pass = fold_mul_zero

        def graph_pass(graph):                      # Inductor style: gets gm.graph; -(-x) -> a copy of x
            for node in list(graph.find_nodes(op="call_function", target=aten.neg.default)):
                inner = node.args[0]
                if getattr(inner, "target", None) is aten.neg.default:
                    with graph.inserting_before(node):
                        node.replace_all_uses_with(graph.call_function(aten.clone.default, (inner.args[0],)))
                    graph.erase_node(node)
        '''))
    unsound = _cli(["check-pass", "mypasses:my_pass", "--examples", "30"], tmp_path)
    assert unsound.returncode == 1, unsound.stdout[-2000:] + unsound.stderr[-3000:]
    assert "fold_mul_zero is unsound" in unsound.stdout and "graph after the pass" in unsound.stdout
    sound = _cli(["check-pass", "mypasses:fold_int_mul_zero", "--dynamic", "--examples", "10"], tmp_path)
    assert sound.returncode == 0, sound.stdout[-2000:] + sound.stderr[-3000:]
    assert "fold_int_mul_zero: ok" in sound.stdout
    graph = _cli(["check-pass", "mypasses:graph_pass", "--takes", "graph", "--examples", "10"], tmp_path)
    assert graph.returncode == 0, graph.stdout[-2000:] + graph.stderr[-3000:]
    for spec in ("no_such_module:my_pass", "mypasses:no_such_pass"):  # README: exits 2 when not there
        missing = _cli(["check-pass", spec, "--examples", "10"], tmp_path)
        assert missing.returncode == 2, (spec, missing.stdout[-1000:], missing.stderr[-2000:])


class _Cached(torch.nn.Module):
    def __init__(self, cache_dir):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 8)
        self.cached_forward = rewrite.inference.cache_compile(self.inner_forward, cache_dir=cache_dir)

    def inner_forward(self, x):
        return torch.relu(self.a(x)) * 2

    def forward(self, x):
        return self.cached_forward(x)


def cli_cache(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = tmp_path / "D"
    model = _Cached(str(d)).eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.inner_forward(x))
    ls = _cli(["cache", "ls", "--dir", str(d)], tmp_path)
    assert ls.returncode == 0, ls.stderr[-3000:]
    rows = [line for line in ls.stdout.splitlines() if line.strip()]
    assert len(rows) == 1 and "_Cached" in rows[0], ls.stdout
    key = rows[0].split()[0]
    info = _cli(["cache", "info", key, "--dir", str(d)], tmp_path)
    assert info.returncode == 0 and key in info.stdout and "{" in info.stdout, info.stdout + info.stderr
    clear = _cli(["cache", "clear", "--dir", str(d)], tmp_path)
    assert clear.returncode == 0 and "removed 1 entries" in clear.stdout, clear.stdout + clear.stderr
    again = _cli(["cache", "ls", "--dir", str(d)], tmp_path)
    assert "no cache entries" in again.stdout, again.stdout
    # without --dir: the cwd's .rewrite_cache
    default = _cli(["cache", "ls"], tmp_path)
    assert default.returncode == 0 and ".rewrite_cache" in default.stdout, default.stdout


def cli_check_backend(tmp_path, monkeypatch):
    (tmp_path / "mymodule.py").write_text("def fn(x, y):\n    return x + (-y) * 1.0\n")
    ok = _cli(["check-backend", "mymodule:fn", "--shapes", "4,8", "4,8", "--backend", "eager", "--examples", "2",
               "--variants", "2"], tmp_path)
    assert ok.returncode == 0 and "check_backend: ok" in ok.stdout, ok.stdout[-2000:] + ok.stderr[-3000:]
    bad = _cli(["check-backend", "mymodule:fn", "--shapes", "4,8:int9"], tmp_path)
    assert bad.returncode == 2, bad.stdout[-1000:] + bad.stderr[-2000:]


CLI_RUNNERS = {
    "check-backend": cli_check_backend,
    "rules": cli_rules,
    "check-rules": cli_check_rules,
    "calibrate": cli_calibrate,
    "check-pass": cli_check_pass,
    "cache": cli_cache,
}


def _documented_subcommands() -> set[str]:
    found = set()
    for path in DOCS:
        text = open(path, encoding="utf-8").read()
        found |= set(CLI_MENTION.findall(MARKER_LINE.sub("", text)))  # markers' reasons are not documentation
    return found


def test_every_documented_cli_subcommand_has_a_runner():
    documented = _documented_subcommands()
    assert documented, "the README shows no `python -m rewrite` command?"
    assert documented <= set(CLI_RUNNERS), f"documented but not run here: {documented - set(CLI_RUNNERS)}"


@pytest.mark.parametrize("sub", sorted(CLI_RUNNERS))
def test_cli_subcommand(sub, tmp_path, monkeypatch):
    runner = CLI_RUNNERS[sub]
    if "monkeypatch" in runner.__code__.co_varnames[:runner.__code__.co_argcount]:
        runner(tmp_path, monkeypatch)
    else:
        runner(tmp_path)


def test_bash_blocks_run(tmp_path):
    """Each line of an unskipped ```bash block runs from a temporary cwd and exits 0."""
    for block in all_blocks():
        if block.lang not in ("bash", "sh", "shell") or _skip_reason(block):
            continue
        for line in block.code.splitlines():
            command = line.split("#", 1)[0].strip()
            if not command:
                continue
            assert command.startswith("python -m rewrite "), \
                f"{block.where}: {command!r} is not a `python -m rewrite` command: mark the block skip (reason)"
            out = _cli(command.split()[3:], tmp_path)
            assert out.returncode == 0, f"{block.where}: {command}\n{out.stderr[-3000:]}"
