"""Issue 26: a compile cache written by someone else is hostile. A tampered entry is a miss (never a
result), folders are never written through symlinks, `cache clear` deletes only what this user's
rewrite signed, `cache ls` escapes control characters, and reads on a miss or hit are bounded.

Each attack goes through the public API the way users call it (`cache_compile`, ``config.cache.dir``
with ``torch.compile``, ``rewrite.load`` with a cache, ``python -m rewrite cache``) and checks a
miss or a clear error, results equal to eager, and nothing outside the cache folder changed."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

import rewrite
from rewrite.cache import counters
from rewrite.cache.store import MAX_SIBLINGS, SIGNATURE_FILE, CacheFolderError, entries
from rewrite.persist.errors import ExportError


def _snapshot(root) -> dict:
    """{relative path: bytes, or 'dir'/'link -> target'} of everything below ``root``."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = "link -> " + os.readlink(path)
            elif os.path.isdir(path):
                out[rel] = "dir"
            else:
                with open(path, "rb") as f:
                    out[rel] = f.read()
    return out


class Relu(torch.nn.Module):
    """Two methods (relu and neg), a folded constant (the weight times 3, 64x64: stored in the entry)."""

    def __init__(self, cache_dir=None):
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(64, 64))
        self.first = rewrite.inference.cache_compile(self.inner, cache_dir=cache_dir)
        self.second = rewrite.inference.cache_compile(self.other, cache_dir=cache_dir)

    def inner(self, x):
        return torch.relu(x @ (self.w * 3)) + 1

    def other(self, x):
        return torch.neg(x @ (self.w * 3)) + 1


def _call(cached, eager, x):
    with torch.no_grad():
        got = cached(x)
        torch.testing.assert_close(got, eager(x))
    return got


def _first_entry(cache) -> str:
    _call(Relu(cache).first, Relu(cache).inner, torch.randn(4, 64))
    folder = os.path.join(cache, "Relu", "inner")
    assert os.path.isfile(os.path.join(folder, "program.json"))
    return folder


def _a_new_process_misses(cache, which="first"):
    """A new wrapper (as in a restarted process) calls: the result equals eager and it was not a hit."""
    hits, traced = counters["hits"], counters["traced"]
    model = Relu(cache)
    _call(getattr(model, which), model.inner if which == "first" else model.other, torch.randn(4, 64))
    assert counters["hits"] == hits and counters["traced"] == traced + 1


# -- tampered entries are misses ------------------------------------------------------------------

def test_tampered_program_is_a_miss(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="rewrite")
    cache = str(tmp_path / "cache")
    folder = _first_entry(cache)
    program = os.path.join(folder, "program.json")
    text = open(program).read()
    assert "aten.relu.default" in text
    with open(program, "w") as f:  # its signature.json is kept as it was
        f.write(text.replace("aten.relu.default", "aten.neg.default"))
    _a_new_process_misses(cache)
    assert any("sha256" in r.getMessage() and "program.json" in r.getMessage() for r in caplog.records)
    hits = counters["hits"]
    _call(Relu(cache).first, Relu(cache).inner, torch.randn(4, 64))  # rebuilt: a hit again
    assert counters["hits"] == hits + 1


def test_tampered_constant_is_a_miss(tmp_path):
    cache = str(tmp_path / "cache")
    folder = _first_entry(cache)
    program_path = os.path.join(folder, "program.json")
    program = json.load(open(program_path))
    stored = [(name, r) for name, r in program["weights"].items() if os.path.isfile(os.path.join(folder, r["file"]))]
    assert stored, "the folded constant is stored in the entry"
    name, record = stored[0]
    path = os.path.join(folder, record["file"])
    tensors = st_load(open(path, "rb").read())
    data = st_save({k: v * 2 for k, v in tensors.items()})
    open(path, "wb").write(data)
    record.update(nbytes=len(data), sha256=hashlib.sha256(data).hexdigest())  # the program agrees with the file
    open(program_path, "w").write(json.dumps(program))
    _a_new_process_misses(cache)

    folder = _first_entry(cache)  # rewritten; now only the weight file (program untouched)
    program = json.load(open(program_path))
    record = program["weights"][name]
    path = os.path.join(folder, record["file"])
    tensors = st_load(open(path, "rb").read())
    open(path, "wb").write(st_save({k: v * 2 for k, v in tensors.items()}))
    _a_new_process_misses(cache)


def test_another_methods_program_under_this_key_is_a_miss(tmp_path):
    cache = str(tmp_path / "cache")
    model = Relu(cache)
    x = torch.randn(4, 64)
    _call(model.first, model.inner, x)
    _call(model.second, model.other, x)
    mine, theirs = (os.path.join(cache, "Relu", m) for m in ("inner", "other"))
    for name in ("program.json", "live.json"):  # their program, under my key and signature
        shutil.copy(os.path.join(theirs, name), os.path.join(mine, name))
    _a_new_process_misses(cache)

    shutil.rmtree(mine)  # their whole signed entry, moved under my method: signed for another place and key
    shutil.copytree(theirs, mine)
    _a_new_process_misses(cache)


class Act(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 8)
        self.act = act

    def forward(self, x):
        return self.act(self.lin(x)) + 1


def _compile(model, x, config):
    torch._dynamo.reset()
    fn = torch.compile(model, backend=rewrite.get_backend(config), dynamic=True)
    with torch.no_grad():
        got = fn(x)
        torch.testing.assert_close(got, model(x))
    return got


def test_another_models_graphs_in_a_cache_dir_entry_is_a_miss(tmp_path):
    config = rewrite.CompilerConfig()
    config.cache.dir = str(tmp_path / "cache")
    relu, sigmoid, x = Act(torch.relu), Act(torch.sigmoid), torch.randn(4, 8)
    _compile(relu, x, config)
    (mine, _), = [e for e in entries(config.cache.dir)]
    _compile(sigmoid, x, config)
    theirs = next(rel for rel, _ in entries(config.cache.dir) if rel != mine)
    shutil.copy(os.path.join(config.cache.dir, theirs, "graphs.json"), os.path.join(config.cache.dir, mine, "graphs.json"))
    hits, damaged = counters["hits"], counters["damaged"]
    _compile(relu, x, config)  # equal to eager (checked inside)
    assert counters["hits"] == hits and counters["damaged"] == damaged + 1


def test_an_edited_gear_graph_of_the_load_cache_is_a_miss(tmp_path):
    model = Act(torch.relu)
    x = torch.randn(4, 8)
    rewrite.inference.set_dim_gears(x, dim_gears={0: [2, 4]})
    rewrite.dynamo_export(x, model=model, export_path=str(tmp_path / "export"), dynamic=True)
    config = rewrite.CompilerConfig()
    config.cache.dir = str(tmp_path / "cache")
    rewrite.load(str(tmp_path / "export"), config=config)
    (rel, _), = entries(config.cache.dir)
    path = os.path.join(config.cache.dir, rel, "graphs.json")
    data = json.load(open(path))
    gear = data["graphs"]["gear:4"]
    node = next(n for n in gear["nodes"] if n["op"] == "aten.relu.default")
    node["op"] = "aten.neg.default"
    open(path, "w").write(json.dumps(data))
    hits = counters["hits"]
    loaded = rewrite.load(str(tmp_path / "export"), config=config)
    assert counters["hits"] == hits
    y = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(y), model(y))


# -- folders ---------------------------------------------------------------------------------------

class Inner(torch.nn.Module):
    def __init__(self, cache_dir):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 8)
        self.cached = rewrite.inference.cache_compile(self.inner, cache_dir=cache_dir)

    def inner(self, x):
        return torch.relu(self.lin(x))


def test_symlinked_model_folder_writes_and_deletes_nothing_outside(tmp_path, caplog):
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    (outside / "inner").mkdir(parents=True)
    (outside / "inner" / "data.txt").write_text("user data")
    (outside / "notes.txt").write_text("more user data")
    cache.mkdir(mode=0o700)
    (cache / "Inner").symlink_to(outside)  # {cache}/{model} -> a folder holding inner/ (the method's name)
    before = _snapshot(outside)
    for _ in range(2):  # a miss, then (nothing cached) a miss again
        model = Inner(str(cache))
        _call(model.cached, model.inner, torch.randn(4, 8))
    assert _snapshot(outside) == before
    assert any("symlink" in r.getMessage() for r in caplog.records)


def test_symlinked_graphs_folder_writes_nothing_outside(tmp_path):
    config = rewrite.CompilerConfig()
    config.cache.dir = str(tmp_path / "cache")
    (tmp_path / "cache").mkdir(mode=0o700)
    (tmp_path / "outside").mkdir()
    (tmp_path / "cache" / "graphs").symlink_to(tmp_path / "outside")
    writes = counters["writes"]
    for _ in range(2):
        _compile(Act(torch.relu), torch.randn(4, 8), config)
    assert os.listdir(tmp_path / "outside") == [] and counters["writes"] == writes


def test_a_named_cache_folder_open_to_others_is_a_clear_error(tmp_path):
    cache = tmp_path / "shared"
    cache.mkdir()
    os.chmod(cache, 0o777)
    model = Inner(str(cache))
    with pytest.raises(CacheFolderError, match="other users"):
        model.cached(torch.randn(4, 8))
    assert os.listdir(cache) == []


def test_the_default_cache_folder_open_to_others_is_a_warning_and_no_caching(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    os.mkdir(".rewrite_cache")
    os.chmod(".rewrite_cache", 0o777)
    model = Inner(None)
    _call(model.cached, model.inner, torch.randn(4, 8))
    assert os.listdir(".rewrite_cache") == []
    assert any("refused" in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


# -- the CLI ---------------------------------------------------------------------------------------

def test_cache_clear_on_a_wrong_folder_deletes_nothing(tmp_path, capsys):
    from rewrite.cli import main

    wrong = tmp_path / "project"
    (wrong / "data").mkdir(parents=True)
    (wrong / "data" / "key.json").write_text(json.dumps(  # a folder merely holding a key.json, even a valid one
        {"format": "rewrite.cache.key", "version": 1, "kind": "graph", "label": "x", "fields": {}, "created": "now"}))
    (wrong / "data" / "results.csv").write_text("1,2,3")
    (wrong / ".tmp-notes").mkdir()
    (wrong / ".tmp-notes" / "draft.txt").write_text("draft")
    (wrong / ".trash-bin").mkdir()
    (wrong / "empty").mkdir()
    before = _snapshot(wrong)
    assert main(["cache", "clear", "--dir", str(wrong)]) == 0
    assert "removed 0 entries" in capsys.readouterr().out
    assert _snapshot(wrong) == before

    # In a real cache, clear removes the signed entries and leaves the rest.
    cache = str(tmp_path / "cache")
    _first_entry(cache)
    shutil.copytree(wrong / "data", os.path.join(cache, "data"))
    assert main(["cache", "clear", "--dir", cache]) == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert _snapshot(os.path.join(cache, "data")) == _snapshot(wrong / "data")
    assert not os.path.exists(os.path.join(cache, "Relu"))


def test_cache_ls_escapes_control_characters(tmp_path, capsys):
    from rewrite.cli import main

    cache = str(tmp_path / "cache")
    folder = _first_entry(cache)
    key = json.load(open(os.path.join(folder, "key.json")))
    key["label"] = "evil\x1b]0;title\x07\x1b[2J\x1b]52;c;Y2xpcA==\x07\u202e"
    key["created"] = "\x1b[31mred"
    open(os.path.join(folder, "key.json"), "w").write(json.dumps(key))
    assert main(["cache", "ls", "--dir", cache]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "evil\\x1b]0;title\\x07" in out and "not signed" not in out
    assert main(["cache", "info", "Relu/inner", "--dir", cache]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    _a_new_process_misses(cache)  # an edited key.json is a miss too


# -- bounds ----------------------------------------------------------------------------------------

def test_a_miss_reads_a_bounded_number_of_bounded_sibling_keys(tmp_path, monkeypatch, caplog):
    import rewrite.cache.store as store
    import rewrite.persist.checks as checks

    caplog.set_level(logging.INFO, logger="rewrite")
    config = rewrite.CompilerConfig()
    config.cache.dir = str(tmp_path / "cache")
    graphs = tmp_path / "cache" / "graphs"
    graphs.mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path / "cache", 0o700)
    big = b'{"format": "rewrite.cache.key", "version": 1, "pad": "' + b" " * (1 << 20) + b'"}'
    for i in range(300):  # 300 siblings with 1 MiB key files
        (graphs / f"{i:04d}").mkdir()
        (graphs / f"{i:04d}" / "key.json").write_bytes(big)
    opened = []
    real = checks.read_regular  # every cache file is opened through it
    monkeypatch.setattr(checks, "read_regular", lambda path, **kw: (opened.append(path), real(path, **kw))[1])
    start = time.perf_counter()
    _compile(Act(torch.relu), torch.randn(4, 8), config)
    assert len([p for p in opened if p.endswith("key.json")]) <= MAX_SIBLINGS
    assert time.perf_counter() - start < 60
    assert any("no entry" in r.getMessage() for r in caplog.records)  # none of them named as the nearest
    with pytest.raises(ExportError, match="at most 65536"):
        store.read_key(str(graphs / "0000"))


def test_too_many_gear_graphs_in_a_signed_entry_is_a_bounded_miss(tmp_path):
    from rewrite.cache import store
    from rewrite.gears.spec import MAX_GEARS
    from rewrite.persist import signing

    config = rewrite.CompilerConfig()
    config.cache.dir = str(tmp_path / "cache")
    model, x = Act(torch.relu), torch.randn(4, 8)
    rewrite.inference.set_dim_gears(x, dim_gears={0: [2, 4]})
    _compile(model, x, config)
    (rel, _), = entries(config.cache.dir)
    folder = os.path.join(config.cache.dir, rel)
    data = json.load(open(os.path.join(folder, "graphs.json")))
    gear = data["graphs"]["gear:4"]
    for k in range(MAX_GEARS + 1):  # unused gear graphs, in an entry signed as this user's rewrite signs
        data["graphs"][f"gear:{1000 + k}"] = gear
    raw = json.dumps(data).encode()
    open(os.path.join(folder, "graphs.json"), "wb").write(raw)
    sig = json.load(open(os.path.join(folder, SIGNATURE_FILE)))
    sig["files"]["graphs.json"] = hashlib.sha256(raw).hexdigest()
    sig["hmac"] = signing.sign(store._signed_text(rel, sig["fields"], sig["files"]))
    open(os.path.join(folder, SIGNATURE_FILE), "w").write(json.dumps(sig))
    hits, damaged = counters["hits"], counters["damaged"]
    x = torch.randn(4, 8)
    rewrite.inference.set_dim_gears(x, dim_gears={0: [2, 4]})
    start = time.perf_counter()
    _compile(model, x, config)
    assert counters["hits"] == hits and counters["damaged"] == damaged + 1
    assert time.perf_counter() - start < 60


def test_no_signing_key_is_a_miss_saying_why(tmp_path, monkeypatch, caplog):
    from rewrite.persist import signing

    caplog.set_level(logging.INFO, logger="rewrite")
    cache = str(tmp_path / "cache")
    _first_entry(cache)

    def no_key():
        raise signing.TrustError("the signing key is not private to this user")

    monkeypatch.setattr(signing, "secret", no_key)
    before = _snapshot(cache)
    _a_new_process_misses(cache)
    assert any("cannot be checked" in r.getMessage() for r in caplog.records)
    assert _snapshot(cache) == before  # an entry it cannot sign is neither written nor does it replace one
