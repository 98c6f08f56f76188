"""The cost model's rates, measured on this machine: a short micro-benchmark, cached per machine.

`rewrite.cost` predicts an op's seconds as ``overhead + max(work / rate, bytes / memory rate)`` per
op family, sped up on several threads for large kernels; this module measures those numbers
(about a second: a kernel dispatch, pointwise and copy bandwidth, layer norm, GEMMs at a few
sizes, the fused and packed linear kernels where this ATen build has them, attention, convolution,
GEMM speed per float dtype, and the speed-up of a large GEMM on the process's threads) and keeps
them in a JSON file, so only the first compile on a machine pays for it. ``python -m rewrite
calibrate`` measures again.

Rates are measured on one thread: a kernel on one thread is timed the same whatever else the
machine runs (only preemption adds time, and the fastest of many short batches is free of it:
`rewrite.cost.timing`), whereas a thread pool on a busy machine waits for its slowest thread, whole
scheduler quanta at a time. The multi-thread speed-up is measured once, on a large GEMM, and clamped to [1, threads].

The cache file is keyed by what changes the figures (CPU model, core count, torch version,
intra-op threads, this file's format): a key that differs means stale, and the figures are
measured again and the file replaced. The file is read as hostile input: a regular file (no
symlink, no FIFO: opened with O_NONBLOCK, so nothing planted there can block a compile) of this
user's, mode 0600, at most ``MAX_FILE_BYTES``, JSON with exactly the expected fields, every number finite and within
physical bounds; anything else is damage, logged, measured again and replaced (atomically).
Folder: the per-user cache folder (`rewrite.persist.folders`: ``$REWRITE_CACHE_DIR``, else
``$XDG_CACHE_HOME/rewrite``, else ``~/.cache/rewrite``); read by `rewrite.persist.reading`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import platform
import threading
import time

import torch

from .. import ops
from ..persist.atomic import atomic_write_text
from ..persist.folders import user_cache_dir
from ..persist.reading import read_regular
from ..utils import THREAD_COUNT_LOCK, set_this_thread_intra_op_threads
from .kernel_times import KernelTimes
from .timing import fastest

log = logging.getLogger("rewrite")

__all__ = ["Rate", "Calibration", "CalibrationError", "DEFAULT", "current", "use", "calibrate", "measure",
           "load", "save", "cache_path", "cache_key"]

FORMAT = 2
MAX_FILE_BYTES = 64 * 1024
FAMILIES = ops.COST_FAMILIES  # what rewrite.cost prices, declared once in rewrite.ops
COMPUTE_FAMILIES = tuple(ops.COMPUTE_FAMILIES)  # rates in flops/s; the others in bytes/s
DTYPES = ("float32", "float64", "bfloat16", "float16")
_SECONDS = (1e-9, 0.1)     # bounds of a plausible overhead
_RATE = (1e3, 1e16)        # bounds of a plausible flops/s or bytes/s
_SPEED = (1e-3, 1e3)       # bounds of a dtype's speed relative to float32
KERNEL_TIMES_ENV = "REWRITE_KERNEL_TIMES"  # "0": no kernel measured at a graph's shapes, the rates alone


class CalibrationError(ValueError):
    """A cache file is damaged or stale; the message names the file and the field."""


@dataclasses.dataclass(frozen=True)
class Rate:
    overhead_s: float  # seconds of a call that does no work
    rate: float        # flops/s (compute families) or bytes/s (the others)


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: cost caches key on it
class Calibration:
    dispatch_s: float                 # calling one ATen kernel from generated code
    view_s: float                     # a view op (no data moved)
    families: dict                    # family name -> Rate
    dtype_speed: dict                 # dtype name -> compute speed relative to float32
    threads: int                      # intra-op threads the process runs with
    parallel: float = 1.0             # speed-up of a large kernel on ``threads`` threads over one
    source: str = "default"           # "default", "measured", or the cache file it came from
    # The process's calibration measures GEMM and attention kernels at a graph's own static shapes
    # (`rewrite.cost.kernel_times`); None (the default, and any calibration a caller builds): the rates alone.
    kernel_times: object = None

    def as_json(self) -> dict:
        return {"dispatch_s": self.dispatch_s, "view_s": self.view_s,
                "families": {f: dataclasses.asdict(r) for f, r in self.families.items()},
                "dtype_speed": dict(self.dtype_speed), "threads": self.threads, "parallel": self.parallel}

    def describe(self) -> str:
        lines = [f"cost model ({self.source}): one thread; large kernels {self.parallel:.2f}x faster on "
                 f"{self.threads} threads; dispatch {self.dispatch_s * 1e6:.2f} us, view {self.view_s * 1e6:.2f} us"]
        for f, r in self.families.items():
            unit = "GFLOP/s" if f in COMPUTE_FAMILIES else "GB/s"
            lines.append(f"  {f:<14} overhead {r.overhead_s * 1e6:7.2f} us   {r.rate / 1e9:8.2f} {unit}")
        lines.append("  dtype speed (compute, vs float32): "
                     + ", ".join(f"{d} {s:.2f}" for d, s in self.dtype_speed.items()))
        return "\n".join(lines)


# Used until (or when) nothing is measured: rough figures for one core of a laptop-class CPU.
DEFAULT = Calibration(
    dispatch_s=3e-6, view_s=1e-6,
    families={"gemm": Rate(6e-6, 30e9), "fused_linear": Rate(10e-6, 25e9), "packed_linear": Rate(6e-6, 32e9),
              "attention": Rate(10e-6, 10e9), "convolution": Rate(10e-6, 20e9),
              "normalization": Rate(4e-6, 4e9), "copy": Rate(3e-6, 6e9), "pointwise": Rate(3e-6, 6e9)},
    dtype_speed={"float32": 1.0, "float64": 0.5, "bfloat16": 0.5, "float16": 0.3}, threads=1)


# -- measuring ------------------------------------------------------------------------------------

def _fit(points: list[tuple[float, float]], floor: float) -> Rate:
    """``seconds = overhead + work / rate`` through (work, seconds) points, by least squares on the
    relative error (so the small calls, where the overhead shows, count as much as the big ones)."""
    weights = [1.0 / (t * t) for _, t in points]
    sw = sum(weights)
    mw = sum(q * w for q, (w, _) in zip(weights, points)) / sw
    mt = sum(q * t for q, (_, t) in zip(weights, points)) / sw
    var = sum(q * (w - mw) ** 2 for q, (w, _) in zip(weights, points))
    slope = sum(q * (w - mw) * (t - mt) for q, (w, t) in zip(weights, points)) / var if var else 0.0
    fastest_t = min(t for _, t in points)
    if slope <= 0:  # noise swamped the trend: the largest call alone
        w, t = max(points)
        return Rate(max(min(floor, fastest_t), 1e-9), w / max(t - min(floor, t / 2), 1e-9))
    return Rate(min(max(mt - slope * mw, floor), fastest_t), 1.0 / slope)


def _family_points(quick: bool):
    """(family, [(work, fn)]) for every family this build can run; work in flops or bytes."""
    aten, f32 = torch.ops.aten, torch.float32
    big = [1 << 12, 1 << 16] if quick else [1 << 12, 1 << 16, 1 << 20]
    gemms = [(16, 32, 32), (32, 128, 128)] if quick else [(32, 64, 64), (32, 256, 256), (64, 512, 512),
                                                        (128, 768, 768)]

    def gemm_inputs(m, k, n, dtype=f32):
        return torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype), torch.randn(n, dtype=dtype)

    def vec(n):
        return torch.randn(n)

    out = {"pointwise": [(12 * n, (lambda a=vec(n): aten.add.Tensor._op(a, a))) for n in big],
           "copy": [(8 * n, (lambda a=vec(n): aten.clone.default._op(a))) for n in big],
           "normalization": [(8 * r * c, (lambda a=torch.randn(r, c), c=c: aten.native_layer_norm.default._op(
               a, [c], None, None, 1e-5))) for r, c in ([(16, 64), (64, 256)] if quick else
                                                       [(16, 64), (64, 256), (512, 768)])]}
    gemm = []
    for m, k, n in gemms:
        x, w, b = gemm_inputs(m, k, n)
        gemm.append((2.0 * m * k * n, lambda x=x, w=w, b=b: aten.addmm.default._op(b, x, w)))
    out["gemm"] = gemm
    if hasattr(torch.ops, "mkldnn") and hasattr(torch.ops.mkldnn, "_linear_pointwise") \
            and torch.backends.mkldnn.is_available():
        fused = []
        for m, k, n in gemms:
            x, w, b = gemm_inputs(m, k, n)
            wt = w.t().contiguous()
            fused.append((2.0 * m * k * n, lambda x=x, wt=wt, b=b: torch.ops.mkldnn._linear_pointwise.default(
                x, wt, b, "none", [], "")))
        out["fused_linear"] = fused
    if hasattr(torch.ops, "mkl") and hasattr(torch.ops.mkl, "_mkl_linear") and torch.backends.mkl.is_available():
        packed = []
        for m, k, n in gemms:
            x, w, b = gemm_inputs(m, k, n)
            wt = w.t().contiguous()
            pw = torch.ops.mkl._mkl_reorder_linear_weight(wt, m)
            packed.append((2.0 * m * k * n, lambda x=x, pw=pw, wt=wt, b=b, m=m: torch.ops.mkl._mkl_linear(
                x, pw, wt, b, m)))
        out["packed_linear"] = packed
    attn = []
    for b, h, seq, d in ([(1, 2, 16, 16), (1, 4, 32, 32)] if quick else [(1, 4, 32, 16), (1, 12, 64, 32),
                                                                         (4, 12, 128, 64)]):
        q = torch.randn(b, h, seq, d)
        attn.append((4.0 * b * h * seq * seq * d, lambda q=q: aten._scaled_dot_product_flash_attention_for_cpu
                     .default._op(q, q, q)))
    out["attention"] = attn
    conv = []
    for c, hw in ([(4, 8), (8, 16)] if quick else [(8, 16), (32, 32), (64, 28)]):
        x, w = torch.randn(1, c, hw, hw), torch.randn(c, c, 3, 3)
        conv.append((2.0 * c * c * 9 * hw * hw, lambda x=x, w=w: aten.convolution.default._op(
            x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)))
    out["convolution"] = conv
    return out


def measure(quick: bool = False) -> Calibration:
    """Run the micro-benchmark (about a second; ``quick``: a few hundredths, for tests)."""
    with THREAD_COUNT_LOCK:  # one-thread timings below; no other rewrite path changes the count meanwhile
        return _measure(quick)


def _measure(quick: bool) -> Calibration:
    budget = 0.002 if quick else 0.03
    batches = 5 if quick else 25
    aten = torch.ops.aten
    threads = torch.get_num_threads()
    with torch.no_grad(), torch._subclasses.fake_tensor.unset_fake_temporarily():
        one = torch.ones(1)
        points = _family_points(quick)
        m, k, n = (16, 64, 64) if quick else (32, 256, 256)
        by_dtype = {}
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
            x, w, b = (torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype), torch.randn(n).to(dtype))
            try:
                aten.addmm.default._op(b, x, w)
            except RuntimeError:  # a dtype this build has no CPU GEMM for
                continue
            by_dtype[str(dtype).replace("torch.", "")] = lambda b=b, x=x, w=w: aten.addmm.default._op(b, x, w)
        big = points["gemm"][-1][1]
        fns = [lambda: aten.add.Tensor._op(one, one), lambda: aten.view.default._op(one, [1])]
        fns += [fn for family in points.values() for _, fn in family] + list(by_dtype.values())
        try:
            set_this_thread_intra_op_threads(1)
            times = iter(fastest(fns + [big], budget, batches))
        finally:
            set_this_thread_intra_op_threads(threads)
        big_parallel = fastest([big], budget, batches)[0] if threads > 1 else None
        dispatch, view = next(times), next(times)
        families = {family: _fit([(work, next(times)) for work, _ in family_points], floor=dispatch)
                    for family, family_points in points.items()}
        dtype_times = {d: next(times) for d in by_dtype}
        big_single = next(times)
    for family in FAMILIES:  # kernels this build lacks: priced like what they replace
        families.setdefault(family, families["gemm"] if family in COMPUTE_FAMILIES else families["pointwise"])
    speed = {d: min(max(dtype_times["float32"] / t, _SPEED[0]), _SPEED[1]) for d, t in dtype_times.items()}
    parallel = min(max(big_single / big_parallel, 1.0), float(threads)) if big_parallel else 1.0
    return Calibration(dispatch, view, families, speed, threads, parallel, "measured")


# -- the cache file -------------------------------------------------------------------------------

def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()[:200]
    except OSError:
        pass
    return platform.processor()[:200] or "unknown"


def cache_key() -> dict:
    """What the figures depend on; a cache file with another key is stale."""
    return {"format": FORMAT, "machine": platform.machine(), "cpu": _cpu_model(), "cores": os.cpu_count() or 0,
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def cache_path(folder: str | None = None) -> str:
    """The cache file for this machine, torch version and thread count."""
    digest = hashlib.sha256(json.dumps(cache_key(), sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(folder or user_cache_dir(), f"cost-model-{digest}.json")


def save(cal: Calibration, path: str) -> None:
    """Write ``cal`` to ``path`` atomically: a temporary file (mode 0600) renamed over the name, so a
    symlink or FIFO planted at ``path`` is replaced, never followed or opened; a missing folder is
    made with mode 0700 (the per-user cache is this user's only)."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    doc = {"format": FORMAT, "key": cache_key(), "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
           "calibration": cal.as_json()}
    atomic_write_text(path, json.dumps(doc, indent=1, sort_keys=True))


def _number(path: str, field: str, value, bounds) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not bounds[0] <= value <= bounds[1]:
        raise CalibrationError(f"{path}: field {field} = {value!r} is not a number in [{bounds[0]}, {bounds[1]}]")
    return float(value)


def _object(path: str, field: str, value, keys) -> dict:
    if not isinstance(value, dict) or set(value) != set(keys):
        got = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise CalibrationError(f"{path}: field {field} must hold exactly {sorted(keys)}, got {got}")
    return value


def load(path: str) -> Calibration:
    """The calibration in ``path``; raises CalibrationError naming the file and field when it is
    damaged (unreadable, oversized, not a regular file, malformed) or stale (another key)."""
    try:
        # Never blocks (a FIFO is refused, not opened for a writer that never comes), never follows a
        # symlink, reads at most MAX_FILE_BYTES, and only this user's own file (`save` writes 0600).
        raw = read_regular(path, max_size=MAX_FILE_BYTES, private=True)
    except FileNotFoundError as e:
        raise CalibrationError(f"{path}: cannot open ({e.strerror})") from None
    except OSError as e:  # refused (`FileRefused`): a symlink, a special file, too large
        raise CalibrationError(f"{path}: {e}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CalibrationError(f"{path}: not JSON ({e})") from None
    doc = _object(path, "(top level)", doc, ("format", "key", "measured_at", "calibration"))
    if doc["format"] != FORMAT:
        raise CalibrationError(f"{path}: format {doc['format']!r} is not {FORMAT} (stale)")
    if doc["key"] != cache_key():
        key = doc["key"] if isinstance(doc["key"], dict) else {}
        changed = sorted(k for k, v in cache_key().items() if key.get(k) != v) or ["key"]
        raise CalibrationError(f"{path}: stale, measured for another {', '.join(changed)}")
    body = _object(path, "calibration", doc["calibration"], ("dispatch_s", "view_s", "families", "dtype_speed",
                                                            "threads", "parallel"))
    families = {}
    for name, rate in _object(path, "calibration.families", body["families"], FAMILIES).items():
        rate = _object(path, f"calibration.families.{name}", rate, ("overhead_s", "rate"))
        families[name] = Rate(_number(path, f"families.{name}.overhead_s", rate["overhead_s"], _SECONDS),
                              _number(path, f"families.{name}.rate", rate["rate"], _RATE))
    speeds = body["dtype_speed"]
    if not isinstance(speeds, dict) or not set(speeds) <= set(DTYPES) or "float32" not in speeds:
        raise CalibrationError(f"{path}: field calibration.dtype_speed must map some of {list(DTYPES)} "
                               "(float32 included) to numbers")
    speed = {d: _number(path, f"dtype_speed.{d}", s, _SPEED) for d, s in speeds.items()}
    threads = body["threads"]
    if not isinstance(threads, int) or isinstance(threads, bool) or threads != doc["key"]["threads"]:
        raise CalibrationError(f"{path}: field calibration.threads = {threads!r} does not match the key")
    parallel = _number(path, "parallel", body["parallel"], (1.0, max(1.0, float(threads))))
    return Calibration(_number(path, "dispatch_s", body["dispatch_s"], _SECONDS),
                       _number(path, "view_s", body["view_s"], _SECONDS), families, speed, threads, parallel, path)


def calibrate(folder: str | None = None, quick: bool = False) -> tuple[Calibration, str | None]:
    """Measure now and replace the cache file; returns the calibration and where it was saved
    (None when the folder is not writable: the figures are then used for this process only)."""
    cal = measure(quick=quick)
    path = cache_path(folder)
    try:
        save(cal, path)
        cal = dataclasses.replace(cal, source=path)
    except OSError as e:
        log.warning("cost model: cannot write %s (%s); the calibration is kept for this process only", path, e)
        path = None
    with _lock:
        _process["cal"] = _with_kernel_times(cal)
    return cal, path


# -- the process's calibration --------------------------------------------------------------------

class _State(threading.local):
    override: Calibration | None = None  # set by use() on this thread


_state = _State()
_lock = threading.Lock()
_process: dict = {}  # "cal" -> the calibration this process loaded or measured


def current() -> Calibration:
    """This thread's `use` override, else the process's calibration: the cache file, or measured
    now (once per machine, torch version and thread count) and saved."""
    if _state.override is not None:
        return _state.override
    cal = _process.get("cal")
    if cal is not None and cal.threads == torch.get_num_threads():
        return cal
    with _lock:
        cal = _process.get("cal")
        if cal is None or cal.threads != torch.get_num_threads():
            cal = _process["cal"] = _with_kernel_times(_load_or_measure())
    return cal


def _with_kernel_times(cal: Calibration) -> Calibration:
    """``cal`` with this machine's measured kernel times (`rewrite.cost.kernel_times`), unless
    ``REWRITE_KERNEL_TIMES=0`` asks for the rates alone."""
    if os.environ.get(KERNEL_TIMES_ENV) == "0":
        return cal
    return dataclasses.replace(cal, kernel_times=KernelTimes.for_this_machine(cache_key()))


def _load_or_measure() -> Calibration:
    path = cache_path()
    if os.path.lexists(path):
        try:
            return load(path)
        except CalibrationError as e:
            log.warning("cost model cache: %s; measuring again", e)
    log.info("cost model: calibrating on this machine (once per machine, torch version and thread count)")
    try:
        cal = measure()
    except Exception as e:  # noqa: BLE001 - a failed benchmark must not fail a compile
        log.warning("cost model: calibration failed (%s: %s); using the default figures", type(e).__name__, e)
        return dataclasses.replace(DEFAULT, threads=torch.get_num_threads())
    try:
        save(cal, path)
        return dataclasses.replace(cal, source=path)
    except OSError as e:
        log.warning("cost model: cannot write %s (%s); the calibration is kept for this process only", path, e)
        return cal


@contextlib.contextmanager
def use(cal: Calibration):
    """Make ``cal`` the calibration on this thread inside the block (tests, benchmarks, what-ifs)."""
    before = _state.override
    _state.override = cal
    try:
        yield cal
    finally:
        _state.override = before
