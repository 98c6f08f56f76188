"""The compile cache (issue 17): config.cache.dir, rewrite.inference.cache_compile, cached gear graphs of loads.

Hits are checked in fresh processes by counters (rewrite.cache.counters, and calls of the optimizer);
every key field change is a miss naming the field; damaged entries are misses and are rewritten;
two processes writing one entry both succeed; RNG graphs are refused; results equal eager at every gear.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import rewrite
from rewrite.cache import counters
from rewrite.cached_function import RNG_MESSAGE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A TorchAir-style model (tests/st/torchair_cache_compile_st.py): two cached methods, gears on the batch.
SCRIPT = textwrap.dedent('''
    import json, sys, torch, rewrite
    import rewrite.backend, rewrite.optimizer
    from rewrite.cache import counters
    optimized = []
    real = rewrite.optimizer.optimize
    def counting(*a, **k):
        optimized.append(1)
        return real(*a, **k)
    rewrite.optimizer.optimize = rewrite.backend.optimize = counting
    mode, cache = sys.argv[1], sys.argv[2]

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.linear1 = torch.nn.Linear(8, 16)
            self.linear2 = torch.nn.Linear(16, 4)
            if mode == "function":
                self.cached_prompt = rewrite.inference.cache_compile(self.prompt, cache_dir=cache)
                self.cached_decode = rewrite.inference.cache_compile(self.decode, cache_dir=cache)
        def prompt(self, x):
            return self.linear2(torch.relu(self.linear1(x))) * 2
        def decode(self, x, y):
            return self.linear2(self.linear1(x) + y[0]).sum(-1)

    model = Model().eval()
    if mode == "graph":
        cfg = rewrite.CompilerConfig()
        cfg.cache.dir = cache
        compiled = torch.compile(model.prompt, backend=rewrite.get_backend(cfg), dynamic=True)
    results = []
    for batch in (4, 2):
        x = torch.randn(batch, 8)
        rewrite.inference.set_dim_gears(x, dim_gears={0: [2, 4]})
        y = [torch.randn(batch, 16)]
        with torch.no_grad():
            if mode == "graph":
                got = [compiled(x)]
                want = [model.prompt(x)]
            else:
                got = [model.cached_prompt(x), model.cached_decode(x, y)]
                want = [model.prompt(x), model.decode(x, y)]
        results.append(all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, want)))
    print(json.dumps({"counters": dict(counters), "optimized": len(optimized), "equal": results}))
''')


def _run(tmp_path, mode: str, cache: str, n: int = 1) -> list[dict]:
    """Run the script ``n`` times at once in fresh processes; their reports."""
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1"}
    procs = [subprocess.Popen([sys.executable, str(script), mode, cache], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=str(tmp_path)) for _ in range(n)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def _entries(root) -> list:
    from rewrite.cache.store import entries

    return list(entries(str(root)))


@pytest.mark.parametrize("mode", ["graph", "function"])
def test_two_writers_then_a_hit_in_a_fresh_process(tmp_path, mode):
    cache = str(tmp_path / "cache")
    first = _run(tmp_path, mode, cache, n=2)  # two processes write the same entries at once: both succeed
    for report in first:
        assert report["equal"] == [True, True]
        # Each misses what it compiles first, unless the other process already wrote it when it looks
        # (it starts later, say): a hit, not a failure. At least one of them wrote every entry.
        hits, misses = report["counters"].get("hits", 0), report["counters"].get("misses", 0)
        assert hits + misses == (1 if mode == "graph" else 2)
        assert (report["optimized"] > 0) == (misses > 0)
    assert any(report["counters"].get("misses", 0) >= 1 for report in first)
    found = _entries(cache)
    assert len(found) == (1 if mode == "graph" else 2) and all(isinstance(r, dict) for _, r in found)
    assert not [d for d, _, _ in os.walk(cache) if os.path.basename(d).startswith((".tmp-", ".trash-"))]
    (again,) = _run(tmp_path, mode, cache)
    assert again["equal"] == [True, True]
    assert again["optimized"] == 0  # nothing optimized: neither the graph nor any gear
    assert again["counters"].get("misses", 0) == 0 and again["counters"]["hits"] == (1 if mode == "graph" else 2)
    assert again["counters"].get("traced", 0) == 0  # cache_compile: Dynamo never ran


# -- config.cache.dir in this process ---------------------------------------------------------------

class Small(torch.nn.Module):
    def __init__(self, n=8):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(n, n)
        self.b = torch.nn.Linear(n, n)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))) + 1


def _compile_once(model, x, config, gears=None):
    torch._dynamo.reset()
    if gears:
        rewrite.inference.set_dim_gears(x, dim_gears={0: gears})
    fn = torch.compile(model, backend=rewrite.get_backend(config), dynamic=True)
    with torch.no_grad():
        got = fn(x)
        assert torch.allclose(got, model(x), atol=1e-5)
    return got


def _misses(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "cache miss" in r.getMessage()]


def test_each_key_field_is_a_miss_naming_it(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="rewrite")
    config = rewrite.CompilerConfig()
    config.cache.dir = str(tmp_path)
    model, x = Small(), torch.randn(4, 8)
    _compile_once(model, x, config, [2, 4])
    before = dict(counters)
    _compile_once(model, x, config, [2, 4])
    assert counters["hits"] == before.get("hits", 0) + 1

    def miss(field, *args, **kw):
        caplog.clear()
        _compile_once(*args, **kw)
        assert any(field in m for m in _misses(caplog)), (field, _misses(caplog))

    miss("gears", model, torch.randn(4, 8), config, [4, 8])
    other = rewrite.CompilerConfig()
    other.cache.dir = str(tmp_path)
    other.rules.disabled = ["algebra"]
    miss("config", model, x, other, [2, 4])
    miss("dtype", model.double(), x.double(), config, [2, 4])
    model.float()
    miss("graph", Small(16), torch.randn(4, 16), config, [2, 4])
    frozen = rewrite.CompilerConfig()
    frozen.cache.dir = str(tmp_path)
    frozen.experimental_config.frozen_parameter = True
    _compile_once(model, x, frozen, [2, 4])
    with torch.no_grad():
        model.a.weight[0, 0] += 1  # other weight values: a frozen graph must not be reused
    miss("weights", model, x, frozen, [2, 4])


def test_damaged_entries_are_misses_and_rewritten(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="rewrite")
    config = rewrite.CompilerConfig()
    config.cache.dir = str(tmp_path)
    config.experimental_config.frozen_parameter = True  # weights by reference, folded ones in files
    model, x = Small(), torch.randn(4, 8)
    _compile_once(model, x, config, [2, 4])
    (rel, _), = _entries(tmp_path)
    folder = tmp_path / rel
    for damage in ("truncate", "garbage", "key", "remove"):
        path = folder / ("key.json" if damage == "key" else "graphs.json")
        if damage == "truncate":
            path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
        elif damage in ("garbage", "key"):
            path.write_bytes(b'{"format": "rewrite.cache.graphs", "version": 2, "graphs": {"graph": 7}}')
        else:
            path.unlink()
        before = counters["damaged"]
        _compile_once(model, x, config, [2, 4])  # compiles again, result still right (checked inside)
        assert counters["damaged"] == before + 1, damage
        hits = counters["hits"]
        _compile_once(model, x, config, [2, 4])  # the rewritten entry is good again
        assert counters["hits"] == hits + 1, damage


def test_signed_entries_skip_only_the_meta_inference(tmp_path, monkeypatch):
    """A graph file whose bytes this user's signature vouches for is not shape-inferred again; any
    other bytes (re-serialized, edited metas, another key's signature) are a miss (issue 26)."""
    import rewrite.persist.document as loader
    from rewrite.cache.store import SIGNATURE_FILE, CacheDir, read_key

    inferred = []
    real = loader._check_metas
    monkeypatch.setattr(loader, "_check_metas", lambda g, where: (inferred.append(where), real(g, where))[1])
    config = rewrite.CompilerConfig()
    config.cache.dir = str(tmp_path)
    config.experimental_config.frozen_parameter = True
    model, x = Small(), torch.randn(4, 8)
    _compile_once(model, x, config, [2, 4])
    (rel, _), = _entries(tmp_path)
    folder, cache = tmp_path / rel, CacheDir.get(str(tmp_path))
    fields = read_key(str(folder))["fields"]
    entry = cache.lookup(rel, fields, "test")
    assert entry is not None and set(entry.files) >= {"graphs.json", "key.json"}
    assert cache.lookup(rel, {**fields, "weights": "other"}, "test") is None  # bound to the key
    hits, inferred[:] = counters["hits"], []
    _compile_once(model, x, config, [2, 4])
    assert counters["hits"] == hits + 1 and inferred == []  # signed: decoded and checked, not re-inferred

    graphs = folder / "graphs.json"
    data = json.loads(graphs.read_bytes())
    graphs.write_text(json.dumps(data, indent=1))  # same content, other bytes: a miss (issue 26), rewritten
    damaged = counters["damaged"]
    _compile_once(model, x, config, [2, 4])
    assert counters["hits"] == hits + 1 and counters["damaged"] == damaged + 1

    data = json.loads(graphs.read_bytes())
    node = next(n for g in data["graphs"].values() for n in g["nodes"] if n["op"] == "aten.addmm.default")
    node["meta"]["shape"][-1] += 1  # a wrong recorded shape in a file the signature does not vouch for
    graphs.write_text(json.dumps(data))
    _compile_once(model, x, config, [2, 4])
    assert counters["damaged"] == damaged + 2

    sig = folder / SIGNATURE_FILE  # the entry rewritten above is signed again; a forged signature is no signature
    record = json.loads(sig.read_bytes())
    record["hmac"] = "0" * 64
    sig.write_text(json.dumps(record))
    assert cache.lookup(rel, fields, "test") is None
    hits = counters["hits"]
    _compile_once(model, x, config, [2, 4])
    assert counters["hits"] == hits  # a miss, compiled again (results checked inside)


def test_an_unwritable_cache_warns_once_and_compiles(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    config = rewrite.CompilerConfig()
    config.cache.dir = str(blocker / "cache")
    for _ in range(2):
        _compile_once(Small(), torch.randn(4, 8), config)
    warnings = [r for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(warnings) == 1


def test_gear_progress_lines(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="rewrite")
    _compile_once(Small(), torch.randn(4, 8), rewrite.CompilerConfig(), [2, 4, 8])
    lines = [r.getMessage() for r in caplog.records if "compiled in" in r.getMessage() and "gear" in r.getMessage()]
    assert len(lines) == 3 and "gear 1/3" in lines[0]
    caplog.clear()
    logging.getLogger("rewrite").setLevel(logging.WARNING)
    try:
        _compile_once(Small(), torch.randn(4, 8), rewrite.CompilerConfig(), [2, 4, 8])
    finally:
        logging.getLogger("rewrite").setLevel(logging.NOTSET)
    assert not [r for r in caplog.records if "compiled in" in r.getMessage()]


# -- cache_compile in this process --------------------------------------------------------------

class TwoMethods(torch.nn.Module):
    def __init__(self, cache_dir, **kw):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(8, 8)
        self.cached = rewrite.inference.cache_compile(self.inner, cache_dir=cache_dir, **kw)

    def inner(self, x, *, scale):
        return self.linear(x) * scale

    def forward(self, x):
        return self.cached(x, scale=2.0)


def test_cache_compile_key_fields_and_damage(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="rewrite")
    m = TwoMethods(str(tmp_path))
    x = torch.randn(3, 8)
    assert torch.allclose(m(x), m.inner(x, scale=2.0), atol=1e-6)
    assert (tmp_path / "TwoMethods" / "inner" / "program.json").is_file()
    hits = counters["hits"]
    m2 = TwoMethods(str(tmp_path))
    assert torch.allclose(m2(x), m2.inner(x, scale=2.0), atol=1e-6)
    assert counters["hits"] == hits + 1

    def miss(field, model, *args):
        caplog.clear()
        traced = counters["traced"]
        assert torch.allclose(model(*args), model.inner(*args, scale=2.0), atol=1e-5)
        assert counters["traced"] == traced + 1
        assert any(field in m for m in _misses(caplog)), (field, _misses(caplog))

    m3 = TwoMethods(str(tmp_path))
    with torch.no_grad():
        m3.linear.weight.mul_(2)  # weights are frozen into the program: other values are a miss
    miss("weights", m3, x)
    miss("dtype", TwoMethods(str(tmp_path)).double(), x.double())
    m4 = TwoMethods(str(tmp_path))
    m4.linear = torch.nn.Linear(8, 8, bias=False)
    miss("parameters", m4, x)
    config = rewrite.CompilerConfig()
    config.rules.disabled = ["algebra"]
    miss("config", TwoMethods(str(tmp_path), config=config), x)

    def inner(self, x, *, scale):
        return self.linear(x) * scale + 0.0

    Edited = type("TwoMethods", (TwoMethods,), {"inner": inner})  # the same script, its method edited
    miss("code", Edited(str(tmp_path), config=config), x)
    # damaged: a truncated program is a miss, compiled again and rewritten
    program = tmp_path / "TwoMethods" / "inner" / "program.json"
    program.write_bytes(program.read_bytes()[:100])
    damaged = counters["damaged"]
    m5 = Edited(str(tmp_path), config=config)
    assert torch.allclose(m5(x), m5.inner(x, scale=2.0), atol=1e-5)
    assert counters["damaged"] == damaged + 1
    hits = counters["hits"]
    m6 = Edited(str(tmp_path), config=config)
    m6(x)
    assert counters["hits"] == hits + 1


def test_cache_compile_sees_weights_change_between_calls(tmp_path):
    """One wrapped method, its weights changed between calls in each way a user can: every call
    after a change computes with the new weights (a miss and a new program), never a stale one."""
    m = TwoMethods(str(tmp_path))
    x = torch.randn(4, 8)

    def check():
        with torch.no_grad():
            torch.testing.assert_close(m(x), m.inner(x, scale=2.0), rtol=1e-5, atol=1e-5)

    check()
    misses = counters["misses"]
    with torch.no_grad():
        m.linear.weight.mul_(2)  # in place: the version counter moves
    check()
    m.linear.weight.data = torch.randn(8, 8)  # new storage, same Parameter object
    check()
    m.linear.bias = torch.nn.Parameter(torch.randn(8))  # a new Parameter registered
    check()
    m.linear = torch.nn.Linear(8, 8)  # a new submodule
    check()
    check()  # nothing changed: the program of the call before serves it
    assert counters["misses"] == misses + 4


def test_a_compiled_forward_that_builds_modules_does_not_recompile_once_cache_compile_watches(tmp_path):
    """cache_compile watches module registrations process-wide; a torch.compile'd model that builds a module
    in its forward (Llama slices its ModuleList) must not recompile on every call because of that watch."""
    TwoMethods(str(tmp_path))  # installs the registration hooks

    class Sliced(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(3)])

        def forward(self, x):
            for layer in self.layers[:2]:  # a new ModuleList: add_module runs the hooks
                x = layer(x)
            return x

    model = Sliced().eval()
    from torch._dynamo.testing import CompileCounterWithBackend

    counting = CompileCounterWithBackend("rewrite")
    compiled = torch.compile(model, backend=counting, fullgraph=True)
    with torch.no_grad():
        for _ in range(12):
            x = torch.randn(2, 8)
            torch.testing.assert_close(compiled(x), model(x))
    assert counting.frame_count == 1


def test_cache_compile_refuses_rng_and_bad_arguments(tmp_path):
    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cached = rewrite.inference.cache_compile(self.inner, cache_dir=str(tmp_path))

        def inner(self, x):
            return x + torch.randn(x.shape)

    with pytest.raises(rewrite.CompileError, match=RNG_MESSAGE):
        Noisy().cached(torch.randn(2, 2))
    assert not _entries(tmp_path)
    with pytest.raises(TypeError, match="bound method"):
        rewrite.inference.cache_compile(lambda x: x)
    config, other = rewrite.CompilerConfig(), rewrite.CompilerConfig()
    other.mode = "reduce-overhead"
    with pytest.raises(ValueError, match="config in current backend is different"):
        rewrite.inference.cache_compile(Small().forward, config=config, backend=rewrite.get_backend(other))


def test_compat_spelling(tmp_path):
    import rewrite.compat.torchair as torchair

    model, x = Small(), torch.randn(2, 8)
    cached = torchair.inference.cache_compile(model.forward, cache_dir=str(tmp_path),
                                              backend=torchair.get_npu_backend())
    assert torch.allclose(cached(x), model(x), atol=1e-6)
    assert (tmp_path / "Small" / "forward" / "key.json").is_file()


def test_results_equal_eager_at_every_gear(tmp_path):
    """BERT (HF, small config) through cache_compile: compiled, then loaded by a new wrapper, every gear."""
    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = rewrite.models.bert()
            self.cached = rewrite.inference.cache_compile(self.encode, cache_dir=str(tmp_path))

        def encode(self, ids):
            return self.bert(ids).last_hidden_state

    for round_ in range(2):
        m = Encoder()
        hits = counters["hits"]
        for batch in (4, 1, 2):
            ids = rewrite.models.token_batch(batch, 16)
            rewrite.inference.set_dim_gears(ids, dim_gears={0: [1, 2, 4]})
            with torch.no_grad():
                assert torch.allclose(m.cached(ids), m.encode(ids), atol=1e-5)
        if round_:
            assert counters["hits"] == hits + 1


@pytest.mark.parametrize("dynamic", [True, False])
def test_cache_compile_with_gears_marked_on_the_first_call_only(tmp_path, monkeypatch, dynamic):
    """TorchAir's way: set_dim_gears on the first call's inputs, later calls unmarked, default cache_dir."""
    monkeypatch.chdir(tmp_path)

    class Geared(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.linear = torch.nn.Linear(8, 8)
            self.cached = rewrite.inference.cache_compile(self.inner, dynamic=dynamic)

        def inner(self, x):
            return torch.relu(self.linear(x)) * 2

    def calls(model):
        first = torch.randn(1, 8)
        rewrite.inference.set_dim_gears(first, dim_gears={0: [1, 2, 4]})
        for x in (first, torch.randn(2, 8), torch.randn(4, 8), torch.randn(1, 8)):
            with torch.no_grad():
                torch.testing.assert_close(model.cached(x), model.inner(x))

    traced, hits, misses = counters["traced"], counters["hits"], counters["misses"]
    calls(Geared())
    assert counters["traced"] == traced + 1  # one compile serves every later call, marked or not
    assert counters["misses"] == misses + 1
    assert [rel for rel, _ in _entries(".rewrite_cache")] == [os.path.join("Geared", "inner")]  # the default folder
    calls(Geared())  # a new wrapper (as in a restarted process) loads the entry the first one wrote
    assert counters["traced"] == traced + 1 and counters["hits"] == hits + 1


# A geared cached method, its first call at argv[1] (marked with the gears), then every gear twice, unmarked.
GEARED_SCRIPT = textwrap.dedent('''
    import json, sys, torch, rewrite
    from torch._dynamo.utils import counters as dynamo
    from rewrite.cache import counters
    first, cache = int(sys.argv[1]), sys.argv[2]

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a = torch.nn.Linear(8, 16)
            self.b = torch.nn.Linear(16, 4)
            self.cached = rewrite.inference.cache_compile(self.inner, cache_dir=cache)
        def inner(self, x):
            return self.b(torch.relu(self.a(x))).softmax(-1) * x.shape[0]

    model = Model().eval()
    x = torch.randn(first, 8)
    rewrite.inference.set_dim_gears(x, dim_gears={0: [1, 2, 4]})
    calls = [x] + [torch.randn(b, 8) for b in (1, 2, 4) if b != first] + [torch.randn(b, 8) for b in (4, 2, 1)]
    equal = []
    for c in calls:
        with torch.no_grad():
            got, want = model.cached(c), model.inner(c)
        torch.testing.assert_close(got, want)
        equal.append(c.shape[0])
    print(json.dumps({"unique_graphs": dynamo["stats"]["unique_graphs"], "counters": dict(counters), "equal": equal}))
''')


@pytest.mark.parametrize("writer_first, reader_first", [(1, 4), (4, 1)])
def test_cache_compile_warm_start_serves_every_gear_without_dynamo(tmp_path, writer_first, reader_first):
    """A fresh process loading a geared method's entry runs gears 1, 2 and 4 with no Dynamo graph,
    whatever size its first call has (the writer's first call had another)."""
    script = tmp_path / "geared.py"
    script.write_text(GEARED_SCRIPT)
    cache = str(tmp_path / "cache")
    env = {**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1"}

    def run(first: int) -> dict:
        p = subprocess.run([sys.executable, str(script), str(first), cache], capture_output=True, text=True,
                           env=env, cwd=str(tmp_path), timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    wrote = run(writer_first)
    assert wrote["counters"].get("traced") == 1 and wrote["counters"].get("misses") == 1
    assert sorted(set(wrote["equal"])) == [1, 2, 4]
    warm = run(reader_first)
    assert sorted(set(warm["equal"])) == [1, 2, 4] and len(warm["equal"]) == 6  # every call equal to eager
    assert warm["unique_graphs"] == 0  # Dynamo traced nothing
    assert warm["counters"].get("traced", 0) == 0 and warm["counters"].get("misses", 0) == 0
    assert warm["counters"]["hits"] == 1


def test_geared_export_load_reuses_gear_graphs(tmp_path, monkeypatch):
    import rewrite.persist.document as loader
    from rewrite.cache.store import SIGNATURE_FILE

    inferred = []
    real = loader._check_metas
    monkeypatch.setattr(loader, "_check_metas", lambda g, where: (inferred.append(where), real(g, where))[1])
    model = Small()
    x = torch.randn(4, 8)
    rewrite.inference.set_dim_gears(x, dim_gears={0: [2, 4]})
    rewrite.dynamo_export(x, model=model, export_path=str(tmp_path / "export"), dynamic=True)
    config = rewrite.CompilerConfig()
    config.cache.dir = str(tmp_path / "cache")
    first = rewrite.load(str(tmp_path / "export"), config=config)
    assert inferred  # the first load checks the export's recorded shapes
    hits, inferred[:] = counters["hits"], []
    second = rewrite.load(str(tmp_path / "export"), config=config)
    assert counters["hits"] == hits + 1
    assert "gear graphs" in second.report.applied and not second.report.stage_seconds.get("egraph.saturate")
    # The signed entry's key holds the program's digest, written after that program was checked:
    # neither the export's graph nor the gear graphs are shape-inferred again.
    assert inferred == []
    for batch in (2, 4):
        y = torch.randn(batch, 8)
        with torch.no_grad():
            assert torch.allclose(second(y), model(y), atol=1e-5) and torch.allclose(first(y), second(y))

    (rel, _), = _entries(tmp_path / "cache")
    sig = tmp_path / "cache" / rel / SIGNATURE_FILE
    record = json.loads(sig.read_bytes())
    record["hmac"] = "0" * 64  # a forged signature is no signature: a miss (issue 26), the export checked again
    sig.write_text(json.dumps(record))
    third = rewrite.load(str(tmp_path / "export"), config=config)
    assert counters["hits"] == hits + 1
    assert sorted(inferred) == ["export.json: graph"]
    with torch.no_grad():
        assert torch.allclose(third(x), model(x), atol=1e-5)


def test_cli(tmp_path, capsys):
    from rewrite.cli import main

    config = rewrite.CompilerConfig()
    config.cache.dir = str(tmp_path)
    _compile_once(Small(), torch.randn(4, 8), config)
    assert main(["cache", "ls", "--dir", str(tmp_path)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("graphs/") and "g" in line
    key = line.split()[0].split("/")[1][:8]
    assert main(["cache", "info", key, "--dir", str(tmp_path)]) == 0
    info = capsys.readouterr().out
    for field in ("graph", "inputs", "config", "weights", "gears", "versions", "device", "dtype"):
        assert f'"{field}"' in info
    assert main(["cache", "info", "nope", "--dir", str(tmp_path)]) == 2
    (tmp_path / "keep.txt").write_text("not ours")
    assert main(["cache", "clear", "--dir", str(tmp_path)]) == 0
    assert "removed 1" in capsys.readouterr().out
    assert not _entries(tmp_path) and (tmp_path / "keep.txt").is_file()
