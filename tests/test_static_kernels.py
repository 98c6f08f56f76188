"""Static kernels (seed 002): records in the seed's layout, one artifact per build, reuse across
processes, LOCAL_WORLD_SIZE, concurrent builders, damaged or forged artifacts, and the generated
kernels against ATen op by op."""
from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import zipfile

import logging
import pytest
import torch

import rewrite
import rewrite.kernels.static_kernels as kernels_module
from rewrite.config import ConfigError
from rewrite.kernels import StaticKernelError, artifact, cgen, compiler, signature
from rewrite.persist import signing as trust
from rewrite.ops import dtype_str

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUTPUTS = "aclnn_static_shape_kernel_outputs"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private signing key, an empty build dir, and a process cache that has loaded nothing yet."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(kernels_module, "_loaded", kernels_module._Loaded())
    build = tmp_path / "build"
    build.mkdir()
    return build


def _config(build) -> rewrite.CompilerConfig:
    config = rewrite.CompilerConfig()
    config.mode = "reduce-overhead"
    config.experimental_config.frozen_parameter = True
    config.experimental_config.aclgraph._aclnn_static_shape_kernel = True
    config.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir = str(build)
    return config


class Block(torch.nn.Module):
    def __init__(self, vocab: int = 50, width: int = 16):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.ln = torch.nn.LayerNorm(width)
        self.fc = torch.nn.Linear(width, width)

    def forward(self, ids):
        h = self.ln(self.emb(ids))
        a = torch.softmax(self.fc(h) @ h.transpose(1, 2), dim=-1)
        return torch.nn.functional.gelu(a @ h) + h


def _compile(build, gears=(1, 2)):
    torch.manual_seed(0)
    model = Block().eval()
    backend = rewrite.get_backend(_config(build))
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    first = torch.randint(0, 50, (gears[-1], 6))
    rewrite.inference.set_dim_gears(first, {0: list(gears)})
    with torch.no_grad():
        compiled(first)
        for b in gears:
            ids = torch.randint(0, 50, (b, 6), generator=torch.Generator().manual_seed(b))
            torch.testing.assert_close(compiled(ids), model(ids), atol=2e-5, rtol=1e-4)
    return model, compiled, backend


def _applied(backend, what: str) -> int:
    return backend.report.graphs[0].applied.get(what, 0)


def _artifacts(build) -> list:
    return sorted(str(p) for p in (build / OUTPUTS).glob("*_outputs/static_kernel_*.run"))


def test_records_and_artifact_follow_the_seed_layout(home):
    _, _, backend = _compile(home)
    sessions = list((home / OUTPUTS).iterdir())
    session = next(s for s in sessions if s.name.endswith(f"_{os.getpid()}_outputs"))
    assert re.fullmatch(rf"\d{{20}}_{os.getpid()}_outputs", session.name)
    kernels_dir, debug_dir = session / str(os.getpid()), session / f"{os.getpid()}_debug"
    records = sorted(p.name for p in kernels_dir.iterdir())
    debug = sorted(p.name for p in debug_dir.iterdir())
    assert records and set(records) <= set(debug) and len(debug) > len(records)
    for name in records + debug:
        assert re.fullmatch(r"[A-Za-z0-9_]+_(float|double|int64|bool)_ND_[0-9_]+_\d+\.json|[A-Za-z0-9_]+_\d+\.json", name)
    assert any(n.startswith("embedding_float_ND_") for n in records)
    record = json.loads((kernels_dir / records[0]).read_text())
    assert set(record) == {"graph", "node", "signature", "kernel"} and record["kernel"]
    signature.check(record["signature"])
    (path,) = _artifacts(home)
    assert re.fullmatch(r"static_kernel_\d{8}_\d{6}_\d{6}_\d+\.run", os.path.basename(path))
    with zipfile.ZipFile(path) as z:
        assert sorted(z.namelist()) == ["kernels.c", "kernels.so", "manifest.hmac", "manifest.json"]
        manifest = json.loads(z.read("manifest.json"))
    assert manifest["context"]["torch"] == torch.__version__
    assert len(manifest["kernels"]) == _applied(backend, "static kernels built") > 0
    keys = {json.loads((kernels_dir / r).read_text())["kernel"] for r in records}
    assert keys <= {k["key"] for k in manifest["kernels"]}


_PROCESS = textwrap.dedent("""
    import json, sys, torch, rewrite
    sys.path.insert(0, {tests!r})
    from test_static_kernels import _compile, _applied
    _, _, backend = _compile({build!r})
    print("RESULT", json.dumps({{"built": _applied(backend, "static kernels built"),
                                "needed": _applied(backend, "static kernels")}}))
""")


def _spawn(build, env_extra=None):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=ROOT, **(env_extra or {}))
    return subprocess.Popen([sys.executable, "-c", _PROCESS.format(tests=HERE, build=str(build))], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def _result(proc) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT"))[7:])


def test_a_second_process_builds_nothing(home):
    first = _result(_spawn(home))
    second = _result(_spawn(home))
    assert first["built"] == first["needed"] > 0
    assert second == {"built": 0, "needed": first["needed"]}
    assert len(_artifacts(home)) == 1


def test_two_processes_building_at_once_build_each_kernel_once(home):
    env = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    procs = [_spawn(home, dict(env, LOCAL_RANK=str(r))) for r in range(2)]
    results = [_result(p) for p in procs]
    assert sorted(r["built"] for r in results) == [0, results[0]["needed"]]
    assert len(_artifacts(home)) == 1


def test_local_world_size_is_required_with_several_processes(home, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(StaticKernelError, match="LOCAL_WORLD_SIZE"):
        rewrite.get_backend(_config(home))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "zero")
    with pytest.raises(StaticKernelError, match="LOCAL_WORLD_SIZE='zero' must be a positive integer"):
        rewrite.get_backend(_config(home))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    rewrite.get_backend(_config(home))


def test_build_dir_must_exist_and_be_writable(home, tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(StaticKernelError, match=f"build dir {missing} does not exist"):
        rewrite.get_backend(_config(missing))
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(StaticKernelError, match="does not exist"):
        rewrite.get_backend(_config(a_file))
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(StaticKernelError, match=f"build dir {locked} is not writable"):
            rewrite.get_backend(_config(locked))


def test_static_kernels_need_reduce_overhead_mode(home):
    config = _config(home)
    config.mode = "max-autotune"
    with pytest.raises(ConfigError, match="reduce-overhead"):
        rewrite.get_backend(config)


# -- damaged, forged and stale artifacts -----------------------------------------------------------------

def _rewrite_zip(path, members: dict, compression=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        for name, data in members.items():
            z.writestr(name, data)


def _members(path) -> dict:
    with zipfile.ZipFile(path) as z:
        return {n: z.read(n) for n in z.namelist()}


def _signed(members: dict, manifest: dict) -> dict:
    text = json.dumps(manifest).encode()
    return dict(members, **{"manifest.json": text, "manifest.hmac": trust.sign(text).encode()})


def _damage(kind: str, path: str, tmp_path, monkeypatch):
    m = _members(path)
    manifest = json.loads(m["manifest.json"])
    if kind == "truncated":
        data = open(path, "rb").read()
        open(path, "wb").write(data[: len(data) // 2])
    elif kind == "library byte flipped":
        so = bytearray(m["kernels.so"])
        so[len(so) // 2] ^= 0xFF
        _rewrite_zip(path, dict(m, **{"kernels.so": bytes(so)}))
    elif kind == "manifest changed, not re-signed":
        manifest["kernels"][0]["signature"]["outputs"][0]["size"][0] += 1
        _rewrite_zip(path, dict(m, **{"manifest.json": json.dumps(manifest).encode()}))
    elif kind == "signed by another user":
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "someone-else"))
        _rewrite_zip(path, _signed(m, dict(manifest, created="forged")))
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    elif kind == "extra member":
        _rewrite_zip(path, dict(m, **{"../escape.so": b"x"}))
    elif kind == "compressed member":
        _rewrite_zip(path, m, compression=zipfile.ZIP_DEFLATED)
    elif kind == "symlink":
        os.rename(path, path + ".real")
        os.symlink(path + ".real", path)
    elif kind == "key not the hash of its signature":
        manifest["kernels"][0]["key"] = "0" * 64
        manifest["kernels"][0]["symbol"] = "k_" + "0" * 24
        _rewrite_zip(path, _signed(m, manifest))
    elif kind == "bad dtype in a signature":
        manifest["kernels"][0]["signature"]["inputs"][0]["dtype"] = "float32; system('x')"
        _rewrite_zip(path, _signed(m, manifest))
    elif kind == "duplicate manifest keys":
        text = m["manifest.json"].decode().replace('"context":', '"context": {}, "context":', 1).encode()
        _rewrite_zip(path, dict(m, **{"manifest.json": text, "manifest.hmac": trust.sign(text).encode()}))
    elif kind == "oversized":
        monkeypatch.setattr(artifact, "MAX_FILE", 100)
    else:
        raise AssertionError(kind)


DAMAGE = {
    "truncated": "not a zip archive|truncated",
    "library byte flipped": "kernels.so does not match its hash",
    "manifest changed, not re-signed": "signature does not verify",
    "signed by another user": "signature does not verify",
    "extra member": "members are",
    "compressed member": "compressed",
    "symlink": "not a regular file",
    "key not the hash of its signature": "key is not the hash of its signature",
    "bad dtype in a signature": "is not one of",
    "duplicate manifest keys": "duplicate keys",
    "oversized": "at most 100",
}


def test_damaged_or_forged_artifacts_are_refused_with_the_reason(home, tmp_path, monkeypatch):
    _compile(home, gears=(1,))
    (path,) = _artifacts(home)
    pristine = open(path, "rb").read()
    context = {"torch": torch.__version__, "device": compiler.device_key(), "generator": cgen.VERSION}
    assert artifact.read(path, context).kernels
    for kind, message in DAMAGE.items():
        with monkeypatch.context() as m:
            _damage(kind, path, tmp_path, m)
            with pytest.raises(artifact.ArtifactError, match=message):
                artifact.read(path, context)
        if os.path.islink(path):
            os.unlink(path)
            os.rename(path + ".real", path)
        open(path, "wb").write(pristine)
    with pytest.raises(artifact.Stale):
        artifact.read(path, dict(context, torch="0.0"))


def test_a_damaged_artifact_is_rebuilt_never_loaded(home, caplog, monkeypatch):
    _compile(home, gears=(1,))
    (path,) = _artifacts(home)
    members = _members(path)
    so = bytearray(members["kernels.so"])
    so[100] ^= 0xFF
    _rewrite_zip(path, dict(members, **{"kernels.so": bytes(so)}))
    monkeypatch.setattr(kernels_module, "_loaded", kernels_module._Loaded())  # as a new process
    torch._dynamo.reset()
    _, _, backend = _compile(home, gears=(1,))
    assert _applied(backend, "static kernels built") == _applied(backend, "static kernels") > 0
    assert "does not match its hash" in caplog.text and "built anew" in caplog.text
    assert len(_artifacts(home)) == 2


def test_many_unusable_artifacts_in_one_folder_are_one_warning(home, caplog, monkeypatch):
    # The demo's build folder held artifacts of an older run: one WARNING line each drowned the demo's output.
    _compile(home, gears=(1,))
    (path,) = _artifacts(home)
    folder = os.path.dirname(path)
    for k in range(3):
        with open(os.path.join(folder, f"static_kernel_20260101_000000_00000{k}_{k}.run"), "wb") as f:
            f.write(b"not a zip archive")
    monkeypatch.setattr(kernels_module, "_loaded", kernels_module._Loaded())  # as a new process
    torch._dynamo.reset()
    with caplog.at_level(logging.DEBUG, logger="rewrite"):
        _compile(home, gears=(1,))
    unusable = [r for r in caplog.records if "built anew" in r.getMessage()]
    assert len(unusable) == 3
    assert [r.levelno for r in unusable].count(logging.WARNING) == 1
    assert "other unusable artifacts in" in next(r.getMessage() for r in unusable if r.levelno == logging.WARNING)


def test_embedding_index_out_of_range_raises_like_eager(home):
    model, compiled, _ = _compile(home, gears=(1,))
    bad = torch.full((1, 6), 50)
    with pytest.raises(IndexError, match="index out of range in self"):
        model(bad)
    with pytest.raises(IndexError, match=r"index out of range in self \(%embedding"), torch.no_grad():
        compiled(bad)


class _Lookup(torch.nn.Module):
    """A relative-position-bias gather (Swin, BEiT): a table's rows picked by an index tensor."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(7, 3))

    def forward(self, idx):
        return self.table[idx] * 2.0


def test_index_gathers_rows_like_eager_and_raises_like_eager_out_of_range(home):
    model = _Lookup().eval()
    backend = rewrite.get_backend(_config(home))
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    idx = torch.tensor([[0, -1, 6], [3, -7, 2]])
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(idx), model(idx), rtol=0, atol=0)
    bad = torch.tensor([[0, 7, 1], [0, 0, 0]])
    with pytest.raises(IndexError):
        model(bad)
    with pytest.raises(IndexError, match=r"%index"), torch.no_grad():  # the node's name: the static kernel raised
        compiled(bad)


# -- generated kernels against ATen, op by op ----------------------------------------------------------------

def _layout(t: torch.Tensor) -> dict:
    return {"dtype": dtype_str(t.dtype), "size": list(t.shape), "stride": list(t.stride())}


def _case(op, args: dict, out):
    """A signature for ATen ``op`` called with ``args`` (tensors and scalars by schema name)."""
    inputs, tensors, sig_args = [], [], []
    for a in op._schema.arguments:
        v = args.get(a.name, a.default_value if a.has_default_value() else None)
        if isinstance(v, torch.Tensor):
            sig_args.append([a.name, {"tensor": len(inputs)}])
            inputs.append(_layout(v))
            tensors.append(v)
        else:
            sig_args.append([a.name, signature._scalar(v)])
    outs = list(out) if isinstance(out, tuple) else [out]
    sig = signature.check({"op": signature.target_name(op), "args": sig_args, "inputs": inputs,
                           "outputs": [_layout(o) for o in outs]})
    return sig, tensors, outs


def _cases():
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, 6, generator=g)
    x[0, 0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    t = torch.randn(6, 5, 4, generator=g).permute(2, 1, 0)  # strided, same shape as x
    row = torch.randn(6, generator=g)
    pos = torch.rand(4, 5, 6, generator=g) + 0.1
    mask = torch.rand(4, 5, 6, generator=g) > 0.5
    out = [
        (aten.add.Tensor, dict(self=x, other=t, alpha=2)), (aten.sub.Tensor, dict(self=x, other=row)),
        (aten.mul.Tensor, dict(self=t, other=0.5)), (aten.div.Tensor, dict(self=x, other=pos)),
        (aten.rsub.Scalar, dict(self=x, other=1.0)), (aten.neg.default, dict(self=t)),
        (aten.exp.default, dict(self=x)), (aten.log.default, dict(self=pos)), (aten.tanh.default, dict(self=x)),
        (aten.sigmoid.default, dict(self=x)), (aten.relu.default, dict(self=x)), (aten.silu.default, dict(self=t)),
        # at +-inf and near the float limit ATen's vectorized gelu rounds differently (nan or inf): finite values
        (aten.gelu.default, dict(self=t)), (aten.gelu.default, dict(self=t, approximate="tanh")),
        (aten.erf.default, dict(self=x)), (aten.rsqrt.default, dict(self=pos)), (aten.sqrt.default, dict(self=pos)),
        (aten.pow.Tensor_Scalar, dict(self=x, exponent=3.0)), (aten.pow.Tensor_Scalar, dict(self=pos, exponent=1.7)),
        (aten.clamp.default, dict(self=x, min=-0.5, max=0.5)), (aten.maximum.default, dict(self=x, other=t)),
        (aten.where.self, dict(condition=mask, self=x, other=t)), (aten.gt.Tensor, dict(self=x, other=t)),
        (aten.masked_fill.Scalar, dict(self=x, mask=mask, value=-1e9)),
        (aten.clone.default, dict(self=t)), (aten._to_copy.default, dict(self=x, dtype=torch.float64)),
        (aten.native_layer_norm.default, dict(input=t.contiguous(), normalized_shape=[6], weight=row, bias=row,
                                              eps=1e-5)),
        (aten._softmax.default, dict(self=x.nan_to_num(), dim=-1, half_to_float=False)),
        (aten._log_softmax.default, dict(self=x.nan_to_num(), dim=2, half_to_float=False)),
        (aten.addmm.default, dict(self=row, mat1=torch.randn(3, 5, generator=g), mat2=torch.randn(6, 5).t(),
                                  beta=0.5, alpha=2.0)),
        (aten.mm.default, dict(self=torch.randn(5, 3).t(), mat2=torch.randn(5, 4, generator=g))),
        (aten.bmm.default, dict(self=x.nan_to_num(), mat2=torch.randn(4, 6, 3, generator=g))),
        (aten.embedding.default, dict(weight=torch.randn(10, 6, generator=g), indices=torch.tensor([[1, 9], [0, 3]]))),
        (aten.cat.default, dict(tensors=[x, t, torch.empty(0)], dim=1)),
    ]
    for double in (aten.add.Tensor, aten.tanh.default):  # float64
        out.append((double, dict(self=x.double(), other=t.double()) if double is aten.add.Tensor else dict(self=x.double())))
    return out


def test_generated_kernels_match_aten_op_by_op(home):
    cases = []
    for op, args in _cases():
        if op is torch.ops.aten.cat.default:
            tensors = args["tensors"]
            want = op(tensors, args["dim"])
            inputs = [_layout(v) for v in tensors]
            sig = signature.check({"op": "aten.cat.default", "args": [["tensors", {"tensors": [0, 1, 2]}],
                                                                      ["dim", args["dim"]]],
                                   "inputs": inputs, "outputs": [_layout(want)]})
            cases.append((sig, tensors, [want]))
            continue
        want = op(**args)
        sig, tensors, outs = _case(op, args, want)
        cases.append((sig, tensors, outs))
    source = [cgen.RUNTIME, cgen.MATH_DECLARATIONS]
    for k, (sig, _, _) in enumerate(cases):
        code = cgen.generate(sig, f"k_{k:024x}")
        assert code is not None, f"{sig['op']} has no kernel"
        source.append(code)
    so = compiler.compile_library("\n".join(source), str(home))
    lib = compiler.Library(open(so, "rb").read())
    for k, (sig, tensors, outs) in enumerate(cases):
        got = [torch.empty_strided(o.shape, o.stride(), dtype=o.dtype) for o in outs]
        table = [lib.address(f"k_{k:024x}"), len(tensors) + len(got)] + [t.data_ptr() for t in tensors + got]
        assert lib.runner((ctypes.c_void_p * len(table))(*table), 1) == 0
        for g, want in zip(got, outs):
            torch.testing.assert_close(g, want, equal_nan=True, atol=2e-6, rtol=2e-6,
                                       msg=lambda m, sig=sig: f"{sig['op']}: {m}")


def test_unsupported_signatures_get_no_kernel():
    sig = signature.check({"op": "aten.add.Tensor", "args": [["self", {"tensor": 0}], ["other", {"tensor": 1}],
                                                             ["alpha", 1]],
                           "inputs": [{"dtype": "int64", "size": [3], "stride": [1]}] * 2,
                           "outputs": [{"dtype": "int64", "size": [3], "stride": [1]}]})
    assert cgen.generate(sig, "k_x") is None  # integer arithmetic stays with ATen
    assert cgen.generate(dict(sig, op="aten.nonexistent.default"), "k_x") is None
    with pytest.raises(signature.SignatureError):
        signature.check(dict(sig, op="os.system"))


class _ConvAttention(torch.nn.Module):
    """A stem convolution, a depthwise and a 1x1 one, a 1-d convolution over the pixels, then attention over them."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.depthwise = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pointwise = torch.nn.Conv2d(16, 16, 1)
        self.mix = torch.nn.Conv1d(16, 16, 3, padding=1)
        self.attention = torch.nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x):
        h = self.pointwise(torch.relu(self.depthwise(self.stem(x))))
        tokens = self.mix(h.flatten(2)).transpose(1, 2)  # [N, pixels, 16]
        return self.attention(tokens, tokens, tokens, need_weights=False)[0]


def test_small_convolutions_and_attention_run_as_static_kernels_and_match_eager(home):
    torch.manual_seed(0)
    model = _ConvAttention().eval()
    compiled = torch.compile(model, backend=rewrite.get_backend(_config(home)), fullgraph=True)
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        compiled(x)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            got = compiled(x)
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
    aten_ops = {e.name for e in prof.events()}
    assert "aten::_convolution" not in aten_ops, "a convolution ran ATen's kernel"
    assert not any("scaled_dot_product" in name for name in aten_ops), "attention ran ATen's kernel"
