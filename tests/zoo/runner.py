"""Run one architecture through the three modes and compare every output tensor with eager.

Modes:
- ``default``: ``CompilerConfig()`` as it comes (tier-up after ``exec.tier_up_calls`` = 8 calls). The model is
  called tier_up_calls + 3 times, each call on new inputs of one shape, and every call is compared with eager:
  calls 1..8 run the ATen code, call 9 tiers up (plan + static kernels built on its inputs), 10 and 11 run the
  tiered code. A graph that never tiers up is a failure too (the calls after it would test nothing new).
- ``reduce-overhead``: ``mode = "reduce-overhead"`` with static kernels built into a temporary folder; 3 calls.
- ``gears``: default config; ``set_dim_gears(t, {0: [1, 2, 4]})`` on every input tensor of the first call
  (batch 1) that has a dim 0, then calls at batch 1, 2 and 4. A 0-d tensor (a diffusion UNet's timestep as
  pipelines pass it: one step for the whole batch) has no batch dim and is the same at every gear, so it gets
  none. The number of Dynamo graphs is recorded (not required to be 1).

``device="cuda"`` runs the model and its inputs on the GPU (eager on the GPU is the reference). Tier-up is
CPU-only (on CUDA the default mode runs its ATen graph), so there the default mode only compares calls.

Tolerance (float32 end to end; the compiled code differs from eager only in op order, fused/merged GEMMs
and libmvec's vector math): an output element passes when
``|got - want| <= ATOL_REL * max(1, max|want|) + RTOL * |want|`` with ATOL_REL = 1e-4 and RTOL = 1e-3.
Rounding differences here are ~1e-6 of the output scale (2 layers, reductions of <= 256 terms, a few ulp
from vector math), so this leaves ~100x headroom, while a real defect (a wrong mask, bias or kernel)
moves outputs by 1e-2..1 of their scale. Integer and bool outputs must be equal.
"""
from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import time
import traceback

import torch

import rewrite
from .archs import Arch

MODES = ("default", "reduce-overhead", "gears")
ATOL_REL = 1e-4
RTOL = 1e-3
GEARS = [1, 2, 4]
BATCH = 2  # batch of the default and reduce-overhead modes


@dataclasses.dataclass
class ModeResult:
    mode: str
    ok: bool
    max_diff: float = 0.0
    detail: str = ""  # why it failed (or what is worth knowing when it passed)
    graphs: int | None = None  # Dynamo graphs compiled (gears mode)
    seconds: float = 0.0
    xfail: str | None = None  # the known defect's reason, when the arch carries a marker for this mode

    @property
    def status(self) -> str:
        if self.xfail:
            return "XFAIL" if not self.ok else "XPASS"
        return "ok" if self.ok else "FAIL"

    @property
    def counts_as_failure(self) -> bool:
        return self.status in ("FAIL", "XPASS")  # XPASS: the defect is fixed, remove the marker


@dataclasses.dataclass
class ArchResult:
    arch: Arch
    modes: dict
    seconds: float

    @property
    def failed(self) -> bool:
        return any(r.counts_as_failure for r in self.modes.values())


def verdict(result: ArchResult) -> tuple[list[str], list[str], list[str]]:
    """One architecture's modes as the tests judge them: (failures, modes that pass where they carry a known-defect
    marker, which must then go; known defects), each a line naming the mode."""
    modes = result.modes.values()
    failed = [f"{r.mode}: {r.detail}" for r in modes if r.status == "FAIL"]
    fixed = [f"{r.mode}: {r.xfail}" for r in modes if r.status == "XPASS"]
    known = [f"{r.mode}: {r.xfail} ({r.detail})" for r in modes if r.status == "XFAIL"]
    return failed, fixed, known


# -- outputs ---------------------------------------------------------------------------------------------

def flatten(out, prefix: str = "out") -> list[tuple[str, object]]:
    """(path, leaf) for every tensor or scalar in a ModelOutput / tuple / list / dict, in order; None is skipped."""
    if out is None:
        return []
    if isinstance(out, torch.Tensor):
        return [(prefix, out)]
    if isinstance(out, dict):  # ModelOutput is an OrderedDict of its non-None fields
        return [leaf for k, v in out.items() for leaf in flatten(v, f"{prefix}.{k}")]
    if isinstance(out, (tuple, list)):
        return [leaf for i, v in enumerate(out) for leaf in flatten(v, f"{prefix}[{i}]")]
    if isinstance(out, (int, float, bool, str)):
        return [(prefix, out)]
    raise TypeError(f"{prefix}: cannot compare a {type(out).__name__} output")


def compare(got, want) -> tuple[bool, float, str]:
    """(all outputs match, max abs diff over them, what differed)."""
    g, w = flatten(got), flatten(want)
    if [p for p, _ in g] != [p for p, _ in w]:
        return False, math.inf, f"outputs differ in structure: {[p for p, _ in g]} vs {[p for p, _ in w]}"
    worst, problems = 0.0, []
    for (path, a), (_, b) in zip(g, w):
        if not isinstance(b, torch.Tensor):
            if a != b:
                problems.append(f"{path}: {a!r} != {b!r}")
            continue
        if not isinstance(a, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            problems.append(f"{path}: got {_describe(a)}, want {_describe(b)}")
            worst = math.inf
            continue
        if not b.is_floating_point():
            if not torch.equal(a, b):
                problems.append(f"{path}: {int((a != b).sum())} of {b.numel()} elements differ")
                worst = math.inf
            continue
        if b.numel() == 0:
            continue
        a, b = a.double(), b.double()
        scale = max(1.0, float(b.abs().nan_to_num(0, 0, 0).max()))
        diff = (a - b).abs()
        both_nan = a.isnan() & b.isnan()
        diff = torch.where(both_nan, torch.zeros_like(diff), diff.nan_to_num(math.inf, math.inf, math.inf))
        bad = diff > ATOL_REL * scale + RTOL * b.abs().nan_to_num(0, 0, 0)
        d = float(diff.max())
        worst = max(worst, d)
        if bool(bad.any()):
            i = int(diff.flatten().argmax())
            problems.append(f"{path}: {int(bad.sum())} of {b.numel()} elements off, max abs diff {d:.3g} "
                            f"(scale {scale:.3g}) at flat index {i}: got {float(a.flatten()[i]):.6g}, "
                            f"want {float(b.flatten()[i]):.6g}")
    return not problems, worst, "; ".join(problems)


def _describe(t) -> str:
    return f"{t.dtype}{list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


# -- modes -----------------------------------------------------------------------------------------------

def _compile(model, config: rewrite.CompilerConfig):
    backend = rewrite.get_backend(compiler_config=config)
    return torch.compile(model, backend=backend, fullgraph=True), backend


def _notes(backend) -> list[str]:
    return [n for g in backend.report.graphs for n in g.notes]


class _Calls:
    """Compares calls with eager and keeps the first failure and the largest difference."""

    def __init__(self):
        self.worst, self.problems = 0.0, []

    def check(self, label: str, compiled, model, inputs: dict) -> None:
        want = model(**inputs)
        got = compiled(**inputs)
        ok, diff, why = compare(got, want)
        self.worst = max(self.worst, diff)
        if not ok:
            self.problems.append(f"{label}: {why}")

    @property
    def ok(self) -> bool:
        return not self.problems


def _inputs(arch: Arch, batch: int, seed: int, device: str) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in arch.inputs(batch, seed).items()}


def run_default(arch: Arch, model, device: str = "cpu") -> ModeResult:
    config = rewrite.CompilerConfig()
    compiled, backend = _compile(model, config)
    n = config.exec.tier_up_calls
    calls = _Calls()
    for k in range(n + 3):
        calls.check(f"call {k + 1} ({'before' if k < n else 'at' if k == n else 'after'} tier-up)",
                    compiled, model, _inputs(arch, BATCH, k, device))
    notes = _notes(backend)
    tiered = [x for x in notes if "tiered up" in x]
    kept = [x for x in notes if "keeps its ATen code" in x or "without static kernels" in x]
    problems = list(calls.problems)
    if kept:
        problems.append("tier-up fell back: " + " | ".join(kept))
    elif not tiered and device == "cpu":
        problems.append("no graph tiered up: " + (" | ".join(notes) or "no notes"))
    detail = "; ".join(problems) or " | ".join(tiered)
    return ModeResult("default", not problems, calls.worst, detail)


def run_reduce_overhead(arch: Arch, model, device: str = "cpu") -> ModeResult:
    with tempfile.TemporaryDirectory(prefix="zoo-static-kernels-") as build_dir:
        config = rewrite.CompilerConfig()
        config.mode = "reduce-overhead"
        config.experimental_config.aclgraph._aclnn_static_shape_kernel = True
        config.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir = build_dir
        compiled, backend = _compile(model, config)
        calls = _Calls()
        for k in range(3):
            calls.check(f"call {k + 1}", compiled, model, _inputs(arch, BATCH, 100 + k, device))
    notes = [x for x in _notes(backend) if "unplanned" in x or "keeps its executor" in x]
    problems = calls.problems + (["not planned: " + " | ".join(notes)] if notes else [])
    return ModeResult("reduce-overhead", not problems, calls.worst, "; ".join(problems))


def geared_inputs(inputs: dict) -> list[torch.Tensor]:
    """The inputs that take batch gears: tensors with a dim 0. A 0-d tensor or a Python scalar is one value for the
    whole batch (a UNet's timestep), the same at every gear; ``set_dim_gears`` would refuse it (no dim 0)."""
    return [t for t in inputs.values() if isinstance(t, torch.Tensor) and t.dim() > 0]


def run_gears(arch: Arch, model, first_batch: int = GEARS[0], device: str = "cpu") -> ModeResult:
    """Gears on dim 0 of every input, set on the first call (at ``first_batch``), then a call at every gear."""
    from torch._dynamo.utils import counters

    compiled, backend = _compile(model, rewrite.CompilerConfig())
    first = _inputs(arch, first_batch, 200, device)
    for t in geared_inputs(first):
        rewrite.inference.set_dim_gears(t, dim_gears={0: list(GEARS)})
    counters.clear()
    calls = _Calls()
    try:
        calls.check(f"first call (batch {first_batch})", compiled, model, first)
        for b in GEARS:
            calls.check(f"batch {b}", compiled, model, _inputs(arch, b, 300 + b, device))
    finally:
        from rewrite.gears.spec import restore_size_oblivious

        restore_size_oblivious()
    graphs = int(counters["stats"]["unique_graphs"])
    gears = sorted(g for r in backend.report.graphs for g in r.gears)
    detail = "; ".join(calls.problems) or f"{graphs} Dynamo graph(s), gears compiled: {gears}"
    return ModeResult("gears", calls.ok, calls.worst, detail, graphs=graphs)


RUNNERS = {"default": run_default, "reduce-overhead": run_reduce_overhead, "gears": run_gears}


def run_arch(arch: Arch, modes=MODES, verbose: bool = False, device: str = "cpu") -> ArchResult:
    """Every mode on a fresh Dynamo; a mode that raises is a failure naming the exception."""
    t0 = time.perf_counter()
    model = arch.model().to(device)
    results = {}
    for mode in modes:
        torch._dynamo.reset()
        t = time.perf_counter()
        flag = torch.fx.experimental._config.backed_size_oblivious
        try:
            with torch.no_grad():
                r = RUNNERS[mode](arch, model, device=device)
        except Exception as e:  # noqa: BLE001 - reported in the table, with the traceback when verbose
            first_line = (str(e).strip().splitlines() or [""])[0]
            r = ModeResult(mode, False, math.inf, f"{type(e).__name__}: {first_line[:300]}")
            if verbose:
                r.detail += "\n" + traceback.format_exc()
        finally:
            torch.fx.experimental._config.backed_size_oblivious = flag
        r.seconds = time.perf_counter() - t
        r.xfail = arch.xfail.get(mode)
        results[mode] = r
    torch._dynamo.reset()
    return ArchResult(arch, results, time.perf_counter() - t0)


def prepare_environment() -> None:
    """Offline, quiet transformers; tier-up's kernel cache in a private temporary folder, not ~/.cache."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if not os.environ.get("ZOO_KEEP_CACHE"):
        os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="zoo-cache-")
    import transformers

    transformers.logging.set_verbosity_error()


# -- the table -------------------------------------------------------------------------------------------

def _cell(r: ModeResult | None) -> str:
    if r is None:
        return "-"
    d = "inf" if math.isinf(r.max_diff) else f"{r.max_diff:.1e}"
    if r.status != "ok" and math.isinf(r.max_diff) and r.detail:
        d = r.detail.split(":")[0][:18]  # the exception's name
    return f"{r.status} {d}"


def format_table(results: list[ArchResult], modes=MODES) -> str:
    head = ["architecture", "family", *modes, "graphs", "seconds"]
    rows = []
    for res in results:
        g = res.modes.get("gears")
        rows.append([res.arch.name, res.arch.family, *(_cell(res.modes.get(m)) for m in modes),
                     "-" if g is None or g.graphs is None else str(g.graphs), f"{res.seconds:.1f}"])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


def format_details(results: list[ArchResult]) -> str:
    lines = []
    for res in results:
        for r in res.modes.values():
            if r.status != "ok":
                lines.append(f"{res.arch.name} / {r.mode}: {r.status}: {r.detail}")
                if r.xfail:
                    lines.append(f"    marker: {r.xfail}")
    return "\n".join(lines)
