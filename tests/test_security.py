"""rewrite.load on hostile export folders, and rewrite.dynamo_export under faults.

Every crafted folder must end in an ExportError whose message names the file and the field, within
a second or so, with no code of the file's run (payloads try to create a canary file) and nothing
changed on disk, inside the folder or beside it. The threat model is docs/export_format.md,
"Security". Exports are made once per module; each test edits a copy of one.
"""
from __future__ import annotations

import copy
import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rewrite
from rewrite.waits import StreamCycleError
from rewrite.export import ExportError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CANARY = "canary"  # file name a successful payload would create beside the folder


class Seed(torch.nn.Module):
    """x + y + p1 + p2: every op is commutative, so reordered arguments still compute the same."""

    def __init__(self):
        super().__init__()
        self.p1 = torch.nn.Parameter(torch.randn(2, 4))
        self.p2 = torch.nn.Parameter(torch.randn(2, 4))

    def forward(self, x, y):
        return x + y + self.p1 + self.p2


class WithBuffer(Seed):
    """Seed plus a buffer q: its export writes q.safetensors besides Seed's files."""

    def __init__(self):
        super().__init__()
        self.register_buffer("q", torch.randn(2, 4))

    def forward(self, x, y):
        return x + y + self.p1 + self.p2 + self.q


class Broadcast(torch.nn.Module):
    """x * y + p1 + p2 with a dynamic batch: size symbols, bindings and (with gears) gear records."""

    def __init__(self):
        super().__init__()
        self.p1 = torch.nn.Parameter(torch.randn(4))
        self.p2 = torch.nn.Parameter(torch.randn(4))

    def forward(self, x, y):
        return x * y + self.p1 + self.p2


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """name -> (folder, model, example inputs) for a static, a dynamic and a geared export."""
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("exports")
    seed, broadcast = Seed(), Broadcast()
    out = {}
    args = (torch.randn(2, 4), torch.randn(2, 4))
    rewrite.dynamo_export(*args, model=seed, export_path=str(root / "seed"))
    out["seed"] = (root / "seed", seed, args)
    args = (torch.randn(3, 4), torch.randn(3, 4))
    rewrite.dynamo_export(*args, model=broadcast, export_path=str(root / "dyn"), dynamic=True)
    out["dyn"] = (root / "dyn", broadcast, args)
    x = torch.randn(4, 4)
    rewrite.inference.set_dim_gears(x, dim_gears={0: [2, 4]})
    rewrite.dynamo_export(x, torch.randn(4, 4), model=broadcast, export_path=str(root / "geared"), dynamic=True)
    out["geared"] = (root / "geared", broadcast, (torch.randn(4, 4), torch.randn(4, 4)))
    return out


# -- helpers ----------------------------------------------------------------------------------------

def snapshot(root) -> dict:
    """Every file and folder under ``root`` with its kind, size, mtime and content hash."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            digest = None
            if os.path.isfile(path) and not os.path.islink(path) and info.st_size < (1 << 20):
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            out[os.path.relpath(path, root)] = (info.st_mode, info.st_size, info.st_mtime_ns, digest)
    return out


def crafted(exports, name: str, tmp_path, edit=None):
    """A copy of export ``name`` in ``tmp_path/caseN/e`` with ``edit(data, folder)`` applied to its export.json.

    Beside it: ``outside/secret.txt``, which no load may read or change, and the canary's place.
    """
    root = tmp_path / f"case{sum(1 for _ in tmp_path.iterdir())}"
    folder = root / "e"
    shutil.copytree(exports[name][0], folder)
    (root / "outside").mkdir()
    (root / "outside" / "secret.txt").write_text("not for the export")
    if edit is not None:
        path = folder / "export.json"
        data = json.loads(path.read_text())
        result = edit(data, folder)
        if isinstance(result, str):  # raw text
            path.write_text(result)
        elif result is not False:
            path.write_text(json.dumps(data))
    return folder


def refused(folder, match: str, name: str = "export", error=ExportError):
    """Load must raise ``error`` matching ``match`` quickly, run nothing and change nothing on disk."""
    root = folder.parent
    before = snapshot(root)
    t0 = time.monotonic()
    with pytest.raises(error, match=match) as info:
        rewrite.load(str(folder), name)
    assert time.monotonic() - t0 < 5, "refusing a crafted folder must not take long"
    assert not (root / CANARY).exists(), "a payload from the file ran"
    assert snapshot(root) == before, "loading changed files"
    assert "the export is malformed (" not in str(info.value), f"unchecked error slipped through: {info.value!r}"
    return info.value


def node(data, op: str, i: int = 0) -> dict:
    """The i-th node record calling ``op`` (node names depend on the tracer, op names do not)."""
    return [n for n in data["graph"]["nodes"] if n["op"] == op][i]


def canary_code(folder) -> str:
    """Python that creates the canary beside ``folder`` if it ever runs."""
    return f"__import__('os').system('touch {folder.parent / CANARY}')"


# -- ops --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op, match", [
    ("builtins.eval", "is not of the form"),
    ("os.system", "is not of the form"),
    ("torch.ops.load_library", "namespace 'torch' is not one of"),
    ("import_module.os.system", "namespace 'import_module' is not one of"),
    ("aten.__class__.__init__", "is not of the form|not registered"),
    ("aten.add.__call__", "is not of the form|not registered"),
    ("aten.from_file.default", "touches files"),
    ("aten._print.default", "touches files"),
    ("aten.record_stream.default", "touches files"),
    ("debugprims.load_tensor.default", "namespace 'debugprims'"),
    ("c10d.allreduce_.default", "namespace 'c10d'"),
    ("aten.set_.source_Storage", "takes or returns .*Storage"),
    ("aten.no_such_op.default", "not registered"),
    ("higher_order.triton_kernel_wrapper_mutation", "allowed higher-order ops are"),
    ("higher_order.run_const_graph", "allowed higher-order ops are"),
    ("operator.attrgetter", "is not of the form"),
    ("math.system", "is not of the form"),
    ("eval", "is not of the form"),
    (["aten.add.Tensor"], "expected a string, got a list"),
    ("a" * 10_000, "characters long"),
])
def test_op_names_resolve_only_from_the_allow_list(exports, tmp_path, op, match):
    def edit(data, _):
        node(data, "aten.add.Tensor")["op"] = op

    refused(crafted(exports, "seed", tmp_path, edit), r"export\.json: graph\.nodes\[\d+\]( \(\w+\))?\.op: .*(" + match + ")")


def test_file_touching_ops_are_refused_even_with_valid_arguments(exports, tmp_path):
    def edit(data, folder):
        add = node(data, "aten.add.Tensor")
        add.update(op="aten.from_file.default", args=[str(folder.parent / CANARY), True, 8],
                   kwargs={"dtype": {"dtype": "float32"}})

    refused(crafted(exports, "seed", tmp_path, edit), r"\.op: op 'aten\.from_file\.default' is not allowed")


# -- keyword arguments and argument values ------------------------------------------------------------

@pytest.mark.parametrize("op, key, match", [
    ("aten.add.Tensor", "alpha=1)\n    return 0\nimport os\nos.system('touch {canary}')\ndef _f(**k):\n    return _f(x",
     "is not a parameter of aten.add.Tensor"),
    ("aten.add.Tensor", "{code} or alpha", "is not a parameter of aten.add.Tensor"),
    ("aten.add.Tensor", "__class__", "is not a parameter of aten.add.Tensor"),
    ("aten.add.Tensor", "", "is not a parameter of aten.add.Tensor"),
    ("aten.add.Tensor", "self", "unknown keyword arguments"),  # already given positionally
    ("aten.add.Tensor", "alpha", "argument 'alpha' of aten.add.Tensor expects"),  # a string for a number
])
def test_keyword_arguments_must_be_parameters_of_the_op(exports, tmp_path, op, key, match):
    def edit(data, folder):
        node(data, op)["kwargs"] = {key.format(canary=folder.parent / CANARY, code=canary_code(folder)): "x"}

    refused(crafted(exports, "seed", tmp_path, edit), r"graph\.nodes\[\d+\] \(\w+\).*" + match)


def test_size_functions_and_higher_order_ops_take_no_keywords(exports, tmp_path):
    def edit(data, _):
        add = node(data, "aten.add.Tensor")
        add.update(op="mul", kwargs={"a": 1})

    refused(crafted(exports, "seed", tmp_path, edit), r"kwargs\['a'\]: mul takes no keyword arguments")


@pytest.mark.parametrize("arg, match", [
    ("x", r"args: .*argument 'other' of aten\.add\.Tensor expects Tensor, got str|expects Tensor"),
    (None, "expects Tensor, got NoneType"),
    ([{"node": "x"}], "reads node"),
    ({"node": "output"}, "reads node 'output', which is not defined before it"),
    ({"eval": "1"}, r"args\[1\]: unknown argument kind 'eval'"),
    ({"node": "a", "tuple": []}, r"args\[1\]: malformed argument"),
    ({"dtype": "_dynamo"}, r"args\[1\]\.dtype: unknown dtype '_dynamo'"),
    ({"device": "xla:0"}, r"args\[1\]\.device: 'xla:0' is not allowed"),
    ({"float": "1e999"}, r"args\[1\]\.float: unknown float"),
    ({"layout": "__class__"}, r"args\[1\]\.layout: unknown layout"),
    ({"graph": {"name": "g", "symbols": {}, "nodes": []}}, "no output node"),
    ({"tensor": {"dtype": "float32", "shape": [1 << 40], "data": "AAAA"}}, r"args\[1\]\.tensor\.shape: an inline tensor of"),
    ({"tensor": {"dtype": "float32", "shape": [2], "data": "!!"}}, r"args\[1\]\.tensor\.data"),
])
def test_argument_values_are_checked_against_the_schema(exports, tmp_path, arg, match):
    def edit(data, _):
        node(data, "aten.add.Tensor", 1)["args"][1] = arg

    refused(crafted(exports, "seed", tmp_path, edit), r"graph\.nodes\[\d+\] \(\w+\).*" + match)


# -- shape expressions --------------------------------------------------------------------------------

@pytest.mark.parametrize("expr, match", [
    ("9**9**9**9", r"'\*\*' takes a symbolic base"),
    ("s77**9**9**9", r"expected end|'\*\*' takes"),
    ("(((s77**64)**64)**64)", "an exponent above 64"),
    ("s77+" * 3_000_000 + "s77", "characters; at most"),
    ("{code}", "unexpected|neither a symbol"),
    ("s77.__class__", r"unexpected '\.'"),
    ("lambda: 1", "unexpected ':'"),
    ("Symbol('x')", "unexpected"),
    ("(" * 40 + "s77" + ")" * 40, "nested more than"),
    ("-" * 40 + "s77", "nested more than"),
    ("99999999999999999999999*s77", "does not fit in 64 bits"),
    ("Mod(s77, 0)", "ZeroDivisionError|Modulo by zero"),
    ("Mod(s77)", "Mod takes 2 arguments"),
    ("s99", "uses 's99', which is neither a symbol"),
    ("2.5*s77", r"unexpected '\.'"),
    ("s77 if 1 else 2", "expected end|unexpected"),
    ("", "unexpected 'end'|expected"),
])
def test_shape_expressions_are_parsed_by_the_format_grammar(exports, tmp_path, expr, match):
    def edit(data, folder):
        data["graph"]["nodes"][1]["meta"]["shape"][0] = expr.replace("{code}", canary_code(folder))

    refused(crafted(exports, "dyn", tmp_path, edit),
            r"export\.json: graph\.nodes\[1\] \(\w+\)\.meta\.shape\[0\]: malformed shape expression.*(" + match + ")")


# -- paths and symlinks -------------------------------------------------------------------------------

@pytest.mark.parametrize("file", ["../outside/secret.txt", "/etc/passwd", "a/../../outside/secret.txt",
                                  "./p1.safetensors", ".hidden", "p1.safetensors/", "", "sub//p1.safetensors",
                                  "..\\outside\\secret.txt", "p1.safetensors\x00", "a/b/c/d/e.safetensors", 7])
def test_weight_paths_are_relative_and_inside_the_folder(exports, tmp_path, file):
    def edit(data, _):
        data["weights"]["p1"]["file"] = file

    refused(crafted(exports, "seed", tmp_path, edit), r"export\.json: weights\.p1\.file: ")


def test_symlinks_out_of_the_folder_are_refused(exports, tmp_path):
    folder = crafted(exports, "seed", tmp_path)
    outside = folder.parent / "outside"
    # A copy of a real weight outside: size and checksum match, only its place is wrong.
    shutil.copy(folder / "p1.safetensors", outside / "p1.safetensors")
    os.remove(folder / "p1.safetensors")
    os.symlink(outside / "p1.safetensors", folder / "p1.safetensors")
    refused(folder, r"weights\.p1\.file: path 'p1\.safetensors' leads out of the export folder")
    os.remove(folder / "p1.safetensors")
    os.symlink("/dev/zero", folder / "p1.safetensors")
    refused(folder, r"weights\.p1\.file: path 'p1\.safetensors' leads out of the export folder")
    os.remove(folder / "p1.safetensors")
    os.symlink(folder / "p2.safetensors", folder / "p1.safetensors")  # inside the folder: read, then checked
    refused(folder, r"for weight 'p1' fails its checksum")
    graph = folder / "export.json"
    shutil.move(graph, outside / "export.json")
    os.symlink(outside / "export.json", graph)
    refused(folder, r"export_name: path 'export\.json' leads out of the export folder")


def test_special_files_and_oversized_files_are_never_read(exports, tmp_path):
    folder = crafted(exports, "seed", tmp_path)
    os.remove(folder / "p1.safetensors")
    os.mkfifo(folder / "p1.safetensors")  # opening it for reading would block forever
    refused(folder, r"p1\.safetensors for weight 'p1' is not a regular file")
    os.remove(folder / "p1.safetensors")
    os.mkdir(folder / "p1.safetensors")
    refused(folder, r"p1\.safetensors for weight 'p1' is not a regular file")
    os.rmdir(folder / "p1.safetensors")
    with open(folder / "p1.safetensors", "wb") as f:
        f.truncate(8 << 30)  # sparse: 8 GiB claimed, a 116-byte record
    refused(folder, r"p1\.safetensors for weight 'p1' has 8589934592 bytes, expected \d+")


@pytest.mark.parametrize("name", ["../e/export", "/etc/passwd", "a/b", ".export", "", "export\n", 7])
def test_the_export_name_is_a_plain_file_name(exports, tmp_path, name):
    folder = crafted(exports, "seed", tmp_path)
    refused(folder, "export_name: ", name=name)


# -- sizes, depth and numbers --------------------------------------------------------------------------

def _deep(value, levels: int):
    for _ in range(levels):
        value = [value]
    return value


def _squaring_chain(data, _):
    """sym_size -> mul(x, x) forty times: integers of 2**40 bits once a gear makes the size constant."""
    nodes = data["graph"]["nodes"]
    chain = [{"name": "k0", "op": "aten.sym_size.int", "args": [{"node": "arg1_1"}, 0], "meta": {"sym": "s77", "type": "int"}}]
    for i in range(1, 41):
        chain.append({"name": f"k{i}", "op": "mul", "args": [{"node": f"k{i - 1}"}, {"node": f"k{i - 1}"}],
                      "meta": None})
    data["graph"]["nodes"] = nodes[:2] + chain + nodes[2:]


@pytest.mark.parametrize("edit, match", [
    (lambda d, f: d["graph"]["nodes"][2]["args"].append("DEEP") or json.dumps(d).replace(
        '"DEEP"', "[" * 200_000 + "]" * 200_000), r"export\.json: is nested more than 100 levels deep"),
    (lambda d, f: d["graph"]["nodes"][2]["args"].append(_deep(1, 120)), "nested more than 100 levels"),
    (lambda d, f: json.dumps(d).replace('"shape": [4]', '"shape": [' + "9" * 5000 + "]", 1),
     r"export\.json: is not valid JSON.*more than 19 digits"),
    (lambda d, f: json.dumps(d).replace('"lower": 2', '"lower": NaN', 1), r"export\.json: is not valid JSON.*NaN"),
    (lambda d, f: json.dumps(d).replace('"lower": 2', '"lower": 1e999', 1), r"is not valid JSON.*overflows"),
    (lambda d, f: json.dumps(d)[:-1] + ', "name": "again"}', r"is not valid JSON.*'name' appears twice"),
    (lambda d, f: d["weights"]["p1"].update(shape=[-4]), r"weights\.p1\.shape\[0\]: -4 is out of range"),
    (lambda d, f: d["weights"]["p1"].update(shape=[1 << 40, 1 << 40]), r"weights\.p1\.shape: .*elements"),
    (lambda d, f: d["weights"]["p1"].update(shape=[1] * 65), r"weights\.p1\.shape: has 65 entries"),
    (lambda d, f: d["weights"]["p1"].update(nbytes=1 << 62), r"weights\.p1\.nbytes: .* out of range"),
    (lambda d, f: d["graph"]["nodes"][1]["meta"].update(shape=["s77", -4]), r"meta\.shape\[1\]: -4 is out of range"),
    (lambda d, f: d["graph"]["nodes"][1]["meta"].update(shape=[1 << 30] * 3), r"meta\.shape: .* more than"),
    (lambda d, f: d["graph"]["nodes"][2].update(op="aten.ones.default", args=[[1 << 33]],
                                                 kwargs={"dtype": {"dtype": "float32"}}),
     "recorded shapes do not match the ops"),
    (_squaring_chain, r"node k\d+ \(mul\) builds integers that could exceed 4096 bits"),
    (lambda d, f: d["graph"]["nodes"].__setitem__(slice(2, 2), [
        {"name": "k", "op": "aten.sym_size.int", "args": [{"node": "arg1_1"}, 0], "meta": {"sym": "s77", "type": "int"}},
        {"name": "p", "op": "pow", "args": [{"node": "k"}, {"node": "k"}], "meta": None}]),
     r"node p \(pow\) builds integers"),
])
def test_huge_and_deep_fields_are_bounded(exports, tmp_path, edit, match):
    refused(crafted(exports, "dyn", tmp_path, edit), match)


def test_graph_size_is_bounded(exports, tmp_path):
    def edit(data, _):
        data["graph"]["nodes"] = [{}] * 100_001

    refused(crafted(exports, "seed", tmp_path, edit), r"graph\.nodes: the graph file holds more than 100000 nodes")


def _manifest(**fields):
    """An edit turning the folder into a 2-rank export whose manifest has ``fields`` changed."""
    def edit(data, folder):
        (folder / "export.json").rename(folder / "export0.json")
        sha = hashlib.sha256((folder / "export0.json").read_bytes()).hexdigest()
        manifest = {"format": "rewrite.export.manifest", "version": 2, "name": "export", "world_size": 2,
                    "backend": "gloo", "ranks": [{"rank": 0, "graph": "export0.json", "dir": "rank_0",
                                                  "graph_sha256": sha}],
                    "process_groups": {"0": {"ranks": [0, 1], "world": True}}, "collectives": []}
        manifest.update(fields)
        (folder / "export_manifest.json").write_text(json.dumps(manifest))
        return False
    return edit


@pytest.mark.parametrize("fields, match", [
    ({}, r"export_manifest\.json is a 2-rank export; initialize torch\.distributed"),  # well-formed
    ({"world_size": "2"}, r"export_manifest\.json: world_size: expected an int"),
    ({"world_size": 1 << 40}, r"export_manifest\.json: world_size: .* out of range"),
    ({"ranks": [{"rank": 0, "graph": "../outside/x.json", "graph_sha256": "0" * 64}]},
     r"export_manifest\.json: ranks\[0\]\.graph: '\.\./outside/x\.json' is not allowed"),
    ({"ranks": [{"rank": 5, "graph": "export0.json", "graph_sha256": "0" * 64}]}, r"ranks\[0\]\.rank: 5 is out of range"),
    ({"ranks": [{"rank": 0, "graph": "export0.json", "graph_sha256": "x"}]}, r"ranks\[0\]\.graph_sha256: 'x'"),
    ({"process_groups": {"g": {"ranks": [0, 7], "world": False}}}, r"process_groups\.g\.ranks\[1\]: 7 is out of range"),
    ({"version": 1.5}, r"export_manifest\.json: version: expected an integer"),
    ({"extra": 1}, r"export_manifest\.json: unknown field\(s\) \['extra'\]"),
])
def test_manifests_are_checked_like_graph_files(exports, tmp_path, fields, match):
    refused(crafted(exports, "seed", tmp_path, _manifest(**fields)), match)


# -- versions and malformed fields ----------------------------------------------------------------------

@pytest.mark.parametrize("version, match", [
    (True, "expected an integer format version, got a bool"),
    ("2", "expected an integer format version, got a string"),
    (2.0, "expected an integer format version, got a float"),
    (None, "expected an integer format version, got null"),
    (0, "0 is not a format version this rewrite reads"),
    (-1, "-1 is not a format version"),
    (999, "format version 999, but this rewrite reads versions up to"),
    (1 << 62, "upgrade rewrite"),
])
def test_versions_must_be_supported_ints(exports, tmp_path, version, match):
    refused(crafted(exports, "seed", tmp_path, lambda d, f: d.update(version=version)), r"export\.json.*" + match)


def _drop(path):
    def edit(d, _):
        *head, last = path
        for k in head:
            d = d[k]
        del d[last]
    return edit


def _put(path, value):
    def edit(d, _):
        *head, last = path
        for k in head:
            d = d[k]
        d[last] = value
    return edit


@pytest.mark.parametrize("edit, match", [
    (_put(["weights"], []), r"export\.json: weights: expected an object, got a list"),
    (_put(["inputs"], 5), r"export\.json: inputs: expected an object, got an int"),
    (_put(["graph"], "g"), r"export\.json: graph: expected an object, got a string"),
    (_put(["graph", "nodes"], {}), r"graph\.nodes: expected a list, got an object"),
    (_put(["graph", "nodes", 0], None), r"graph\.nodes\[0\]: expected an object, got null"),
    (_put(["graph", "nodes", 0, "name"], 3), r"graph\.nodes\[0\]\.name: expected a string"),
    (_put(["graph", "nodes", 1, "name"], "arg0_1"), r"graph\.nodes\[1\] \(arg0_1\): a second node named"),
    (_put(["graph", "nodes", 3, "eval"], "x"), r"graph\.nodes\[3\] \(\w+\): unknown field\(s\) \['eval'\]"),
    (_drop(["graph", "nodes", 3, "value"]), r"graph\.nodes\[3\] \(\w+\): missing field\(s\) \['value'\]"),
    (_put(["graph", "nodes", 3, "value"], {"weight": "nope"}), r"value\.weight: names weight 'nope'"),
    (_put(["graph", "nodes", 3, "value"], {"pickle": "x"}), r"value: expected one of the keys weight"),
    (_put(["graph", "nodes", 1, "meta"], {"dtype": "float32"}), r"meta: missing field\(s\) \['shape'\]"),
    (_put(["graph", "nodes", 1, "meta"], {"sym": "s77", "type": "str"}), r"meta\.type: unknown size type"),
    (_put(["graph", "nodes", 1, "meta", "shape"], [True, 4]), r"meta\.shape\[0\]: expected an int, got a bool"),
    (_put(["graph", "symbols", "s77"], []), r"graph\.symbols\.s77: expected an object, got a list"),
    (_put(["graph", "symbols", "s77", "input"], ["arg1_1", 9]), r"graph\.symbols\.s77\.input\[1\]: 9 is out of range"),
    (_put(["graph", "symbols", "s77", "input"], ["nope", 0]), r"graph\.symbols\.s77\.input: 'nope'|a string \('nope'\)"),
    (_put(["graph", "symbols", "s77", "upper"], 1), r"graph\.symbols\.s77\.upper: 1 is out of range"),
    (_put(["graph", "symbols", "Mod"], {"lower": 0, "upper": None}), r"graph\.symbols\.Mod: a symbol may not be named"),
    (_put(["graph", "name"], "class"), r"graph\.name: 'class' is a Python keyword"),
    (_put(["graph", "name"], "a b"), r"graph\.name: 'a b' is not allowed"),
    (_put(["graph", "nodes", 3, "waits"], ["nope"]), r"graph\.nodes\[3\] \(\w+\)\.waits: waits for \['nope'\]"),
    (_put(["graph", "nodes", 3, "attrs"], {"value": 1}), r"attrs\.value: unknown attribute"),
    (_put(["graph", "nodes", 3, "attrs"], {"stream": ""}), r"attrs\.stream: stream_tag must be a non-empty str"),
    (_put(["bindings"], []), r"export\.json: bindings: expected a list of 2, got 0"),
    (lambda d, f: _put(["graph", "nodes", 1, "meta"], {"sym": "s77", "type": "int"})(d, f) or
     _put(["bindings", 1], {"placeholder": "arg1_1", "leaf": 1})(d, f), r"bindings\[1\]\.leaf: leaf 1 is a tensor"),
    (_put(["bindings", 0], {"placeholder": "arg0_1", "symbol": "s1"}), r"bindings\[0\]\.symbol: a string \('s1'\)"),
    (_put(["bindings", 1, "leaf"], 5), r"bindings\[1\]\.leaf: 5 is out of range"),
    (_put(["outputs"], {"output": 3}), r"outputs\.output: 3 is out of range"),
    (_put(["outputs"], {"leaf": -1}), r"outputs\.leaf: -1 is out of range"),
    (_put(["outputs"], {"eval": "x"}), r"outputs: unknown field\(s\) \['eval'\]"),
    (_put(["inputs", "names"], ["x"]), r"inputs\.names: expected a list of 2"),
    (_put(["inputs", "names"], ["x", "def"]), r"inputs\.names\[1\]: 'def' is a Python keyword"),
    (_put(["inputs", "names"], ["x", "x"]), r"export\.json: inputs: argument names \['x', 'x'\] are not unique"),
    (_put(["inputs", "positional", 0], {"leaf": 3, "type": "tensor"}), r"inputs\.positional\[0\]\.leaf: 3 is out"),
    (_put(["inputs", "positional", 0], {"leaf": 0, "type": "module"}), r"inputs\.positional\[0\]\.type: expected one"),
    (_put(["inputs", "same_tensor"], [[1, 0]]), r"inputs\.same_tensor\[0\]: 0 is out of range"),
    (_put(["dynamic"], "yes"), r"export\.json: dynamic: expected true or false"),
    (_put(["surprise"], 1), r"export\.json: unknown field\(s\) \['surprise'\]"),
    (_drop(["graph"]), r"export\.json: missing field\(s\) \['graph'\]"),
    (_put(["format"], "pickle"), r"export\.json is not a rewrite\.export file"),
    (_put(["onnx"], "../x.onnx"), r"export\.json: onnx: '\.\./x\.onnx' is not allowed"),
    (_put(["process_groups"], {"g": {"ranks": [0, 0], "world": True}}), r"process_groups\.g\.ranks: .* names a rank twice"),
    (_put(["weights", "p1", "sha256"], "zz"), r"weights\.p1\.sha256: 'zz' is not allowed"),
    (_put(["weights", "p1", "dtype"], "object"), r"weights\.p1\.dtype: unknown dtype 'object'"),
    (_drop(["weights", "p1", "nbytes"]), r"weights\.p1: missing field\(s\) \['nbytes'\]"),
    (lambda d, f: "", r"export\.json: is not valid JSON"),
    (lambda d, f: "[1, 2]", r"export\.json: expected an object, got a list"),
    (lambda d, f: json.dumps(d)[:-40], r"export\.json: is not valid JSON \(truncated or edited\?\)"),
    (lambda d, f: (f / "export.json").write_bytes(b"\xff\xfe{}") and False, r"export\.json: is not valid JSON"),
])
def test_malformed_fields_are_errors_naming_the_file_and_field(exports, tmp_path, edit, match):
    refused(crafted(exports, "dyn", tmp_path, edit), match)


# -- devices, gears, waits and stream priorities ----------------------------------------------------------

@pytest.mark.parametrize("edit, match", [
    (_put(["weights", "p1", "device"], "cuda:7"), r"weights\.p1\.device: device 'cuda:7' is not available"),
    (_put(["weights", "p1", "device"], "xla"), r"weights\.p1\.device: 'xla' is not allowed"),
    (_put(["graph", "nodes", 1, "meta", "device"], "meta"), r"nodes\[1\] \(\w+\)\.meta\.device: 'meta' is not allowed"),
    (_put(["gears", "policy"], "all"), r"gears\.policy: expected 'zip' or 'product'"),
    (_put(["gears", "inputs", 0, "dims", "0"], [2, 0]), r"gears\.inputs\[0\]\.dims\['0'\]\[1\]: 0 is out of range"),
    (_put(["gears", "inputs", 0, "dims", "0"], [-2]), r"dims\['0'\]\[0\]: -2 is out of range"),
    (_put(["gears", "inputs", 0, "dims", "0"], list(range(1, 102))), r"dims\['0'\]: has 101 entries; at most 100"),
    (_put(["gears", "inputs", 0, "dims", "0"], [2.5]), r"dims\['0'\]\[0\]: expected an int, got a float"),
    (_put(["gears", "inputs", 0, "dims", "7"], [2]), r"gears\.inputs\[0\]\.dims: dim '7' is not a dimension"),
    (_put(["gears", "inputs", 0, "dims", "1"], [4]), r"gears\.inputs\[0\]\.dims: dim '1' is not a dimension with a "
                                                     r"size symbol .* gears need a dynamic dimension"),
    (_put(["gears", "inputs", 0, "placeholder"], "arg9_1"), r"gears\.inputs\[0\]\.placeholder: .* not a tensor input"),
    (_put(["gears", "gears"], [[["arg1_1", 0, 3]]]), r"gears\.gears\[0\]\[0\]: .* not a size declared"),
    (_put(["gears", "gears"], [[["arg1_1", 0, 2]]] * 101), r"gears\.gears: has 101 entries; at most 100"),
    (_put(["gears", "gears"], []), r"gears\.gears: no gears are listed"),
    (_put(["gears", "inputs", 0, "shape"], [4, -4]), r"gears\.inputs\[0\]\.shape\[1\]: -4 is out of range"),
])
def test_devices_and_gear_records_follow_the_rules_of_the_api(exports, tmp_path, edit, match):
    refused(crafted(exports, "geared", tmp_path, edit), match)


def test_wait_cycles_and_stream_priorities_fail_as_at_compile_time(exports, tmp_path):
    def forward_wait(data, _):  # the first add waits for the last one, which reads it: a cycle
        adds = [n for n in data["graph"]["nodes"] if n["op"] == "aten.add.Tensor"]
        adds[0]["waits"] = [adds[-1]["name"]]

    err = refused(crafted(exports, "seed", tmp_path, forward_wait), r"export\.json: graph: .*wait_tensor creates a cycle",
                  error=StreamCycleError)
    assert isinstance(err, ExportError)

    def version1_wait_for(data, _):
        data["version"] = 1
        adds = [n for n in data["graph"]["nodes"] if n["op"] == "aten.add.Tensor"]
        adds[0]["attrs"] = {"wait_for": [{"node": adds[-1]["name"]}]}

    refused(crafted(exports, "seed", tmp_path, version1_wait_for), "wait_tensor creates a cycle", error=StreamCycleError)

    with pytest.raises(TypeError) as compile_time:
        rewrite.scope.stream_switch("1", stream_priority="high")
    err = refused(crafted(exports, "seed", tmp_path, lambda d, f: node(d, "aten.add.Tensor").update(
        attrs={"stream": "1", "stream_priority": "high"})), r"attrs\.stream_priority: stream_priority must be an int")
    assert str(compile_time.value).split(": ", 1)[1] in str(err)


def test_an_acyclic_forward_wait_loads_and_runs(exports, tmp_path):
    def later_wait(data, _):  # independent work may wait for a node written after it
        nodes = data["graph"]["nodes"]
        adds = [n for n in nodes if n["op"] == "aten.add.Tensor"]
        consts = [n for n in nodes if n["op"] == "constant"]
        adds[0]["waits"] = [consts[-1]["name"]]

    folder = crafted(exports, "seed", tmp_path, later_wait)
    _, model, args = exports["seed"]
    torch.testing.assert_close(rewrite.load(str(folder))(*args), model(*args).detach())


# -- faults while exporting ----------------------------------------------------------------------------

def _no_temp_files(root) -> None:
    leftovers = [p for p in snapshot(root) if ".rewrite-export-" in p or ".tmp-" in p]
    assert not leftovers, leftovers


def test_export_survives_a_full_disk(tmp_path):
    """RLIMIT_FSIZE makes every write past 4 KiB fail (EFBIG): no partial folder, the old export intact."""
    script = textwrap.dedent(f"""
        import resource, signal, torch, rewrite
        torch.manual_seed(0)
        small, big = torch.nn.Linear(4, 4), torch.nn.Linear(64, 64)
        rewrite.dynamo_export(torch.randn(2, 4), model=small, export_path={str(tmp_path / "good")!r})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a full disk is an error, not a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # big's weight file has 16 KiB
        for path in ({str(tmp_path / "good")!r}, {str(tmp_path / "new" / "deeper")!r}):
            try:
                rewrite.dynamo_export(torch.randn(2, 64), model=big, export_path=path)
                print("NO ERROR", path)
            except rewrite.export.ExportError as e:
                print("ExportError", e)
    """)
    env = dict(os.environ, PYTHONPATH=REPO, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("ExportError") == 2 and "File too large" in proc.stdout, proc.stdout
    assert not (tmp_path / "new").exists(), "a failed export left a folder behind"
    _no_temp_files(tmp_path)
    good = rewrite.load(str(tmp_path / "good"))
    torch.manual_seed(0)
    small = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    torch.testing.assert_close(good(x), small(x).detach())


def test_a_folder_in_the_way_fails_the_export_and_keeps_the_old_one(tmp_path):
    torch.manual_seed(0)
    old, x = Seed(), (torch.randn(2, 4), torch.randn(2, 4))
    rewrite.dynamo_export(*x, model=old, export_path=str(tmp_path / "e"))
    new = WithBuffer()
    (tmp_path / "e" / "q.safetensors").mkdir()
    before = snapshot(tmp_path)
    with pytest.raises(ExportError, match=r"cannot write q\.safetensors: .*q\.safetensors is a folder"):
        rewrite.dynamo_export(*x, model=new, export_path=str(tmp_path / "e"))
    assert snapshot(tmp_path) == before, "the failed export changed the folder"
    torch.testing.assert_close(rewrite.load(str(tmp_path / "e"))(*x), old(*x).detach())


def test_a_read_only_file_system_fails_the_export_and_keeps_the_old_one(tmp_path, monkeypatch):
    """EROFS where the staging folder is made (root ignores chmod, so the file system refuses instead)."""
    torch.manual_seed(0)
    old, x = Seed(), (torch.randn(2, 4), torch.randn(2, 4))
    rewrite.dynamo_export(*x, model=old, export_path=str(tmp_path / "e"))
    before = snapshot(tmp_path)

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(rewrite.export.files.tempfile, "mkdtemp", read_only)
    with pytest.raises(ExportError, match="cannot write the export to .*Read-only file system; the folder was left"):
        rewrite.dynamo_export(*x, model=WithBuffer(), export_path=str(tmp_path / "e"))
    with pytest.raises(ExportError, match="Read-only file system"):
        rewrite.dynamo_export(*x, model=WithBuffer(), export_path=str(tmp_path / "new" / "e"))
    assert snapshot(tmp_path) == before
    torch.testing.assert_close(rewrite.load(str(tmp_path / "e"))(*x), old(*x).detach())


def test_a_failure_while_files_are_moved_into_place_is_rolled_back(tmp_path, monkeypatch):
    """The third rename fails: the two files already replaced get their old contents back."""
    torch.manual_seed(0)
    old, x = Seed(), (torch.randn(2, 4), torch.randn(2, 4))
    rewrite.dynamo_export(*x, model=old, export_path=str(tmp_path / "e"))
    before = snapshot(tmp_path)
    real_replace, calls = os.replace, []

    def flaky_replace(src, dst):
        if str(tmp_path) in str(dst):  # not the renames of torch's own caches while tracing
            calls.append(dst)
            if len(calls) == 5:  # old p1 aside, new p1, old p2 aside, new p2, then q's fails
                raise OSError(errno.EIO, "Input/output error")
        return real_replace(src, dst)

    monkeypatch.setattr(rewrite.export.files.os, "replace", flaky_replace)
    with pytest.raises(ExportError, match="Input/output error; the folder was left as it was"):
        rewrite.dynamo_export(*x, model=WithBuffer(), export_path=str(tmp_path / "e"))
    monkeypatch.undo()
    assert len(calls) >= 5
    after = snapshot(tmp_path)
    assert {k: v[:2] + v[3:] for k, v in after.items()} == {k: v[:2] + v[3:] for k, v in before.items()}
    torch.testing.assert_close(rewrite.load(str(tmp_path / "e"))(*x), old(*x).detach())


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_fails_the_export_and_keeps_the_old_one(tmp_path):
    torch.manual_seed(0)
    old, x = Seed(), (torch.randn(2, 4), torch.randn(2, 4))
    rewrite.dynamo_export(*x, model=old, export_path=str(tmp_path / "e"))
    os.chmod(tmp_path / "e", 0o555)
    try:
        before = snapshot(tmp_path)
        with pytest.raises(ExportError, match="cannot write the export"):
            rewrite.dynamo_export(*x, model=Seed(), export_path=str(tmp_path / "e"))
        assert snapshot(tmp_path) == before
    finally:
        os.chmod(tmp_path / "e", 0o755)
    torch.testing.assert_close(rewrite.load(str(tmp_path / "e"))(*x), old(*x).detach())


# -- mutated files ---------------------------------------------------------------------------------------

FUZZ_EXAMPLES = int(os.environ.get("REWRITE_FUZZ_EXAMPLES", 0)) // 10 or 60
STRUCTURE_RETYPES = [None, "x", "", [], [[[]]], {}, {"tuple": []}, {"node": "output"}]
NUMBER_RETYPES = [-1, 0, 1.5, 1 << 62, True]


def _retypes(value) -> list:
    """Values of other JSON types. A number never replaces a number, a bool or a structure: ``-1`` for
    ``{"node": "x"}`` or ``1.5`` for ``1`` is a well-formed file of another program, not a malformed one."""
    pool = STRUCTURE_RETYPES + (NUMBER_RETYPES if isinstance(value, str) or value is None else [])
    return [r for r in pool if type(r) is not type(value)]


def _paths(value, path=()):
    """Every (path, value) in a JSON document."""
    yield path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        yield from _paths(v, path + (k,))


def _mutate(data, path, how: str, pick: int):
    data = copy.deepcopy(data)
    *head, last = path
    parent = data
    for k in head:
        parent = parent[k]
    if how == "drop":
        del parent[last]
    elif how == "retype":
        others = _retypes(parent[last])
        parent[last] = others[pick % len(others)]
    elif how == "deepen":
        parent[last] = [[parent[last]]] if pick % 2 else {"tuple": [parent[last]]}
    else:  # swap with a sibling
        keys = list(parent) if isinstance(parent, dict) else list(range(len(parent)))
        other = keys[pick % len(keys)]
        parent[last], parent[other] = parent[other], parent[last]
    return data


class _Timeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _Timeout()


@pytest.fixture(scope="module")
def fuzz_bases(exports, tmp_path_factory):
    """Per base export: its JSON data, a scratch copy of its folder, and the eager result."""
    out = {}
    for name in ("seed", "dyn", "geared"):
        folder, model, args = exports[name]
        scratch = tmp_path_factory.mktemp(f"fuzz_{name}") / "e"
        shutil.copytree(folder, scratch)
        with torch.no_grad():
            out[name] = (json.loads((folder / "export.json").read_text()), scratch, args, model(*args))
    return out


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck),
          derandomize="REWRITE_FUZZ_EXAMPLES" not in os.environ)
@given(base=st.sampled_from(["seed", "dyn", "geared"]), where=st.integers(0, 10**6),
       how=st.sampled_from(["drop", "retype", "deepen", "swap"]), pick=st.integers(0, 100))
def test_mutated_export_files_load_correctly_or_raise_export_error(fuzz_bases, base, where, how, pick):
    data, folder, args, want = fuzz_bases[base]
    paths = [p for p, _ in _paths(data) if p]
    path = paths[where % len(paths)]
    data = _mutate(data, path, how, pick)
    (folder / "export.json").write_text(json.dumps(data))
    before = snapshot(folder.parent)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, 20)
    try:
        try:
            model = rewrite.load(str(folder))
        except ExportError as e:
            assert "the export is malformed (" not in str(e), f"unchecked error slipped through: {e!r}"
            return
        try:
            got = model(*args)
        except (ExportError, rewrite.gears.GearError):
            return  # an input's recorded shape changed, a gear was dropped: the call is refused by name
        got, want = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
        if path[0] == "outputs":  # the file says how to shape the result: any shape of the same tensors is fine
            assert all(any(torch.equal(g, w) for w in want) for g in got if isinstance(g, torch.Tensor))
        else:
            torch.testing.assert_close(got, want)
    except _Timeout:
        pytest.fail(f"load of a mutated file ({how} at {path}) took more than 20 s")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        assert snapshot(folder.parent) == before, "loading changed files"
