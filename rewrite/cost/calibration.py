"""The cost model's rates, measured on this machine: a short micro-benchmark, kept per machine.

`rewrite.cost.model` predicts an op's seconds as ``overhead + max(work / rate, bytes / memory rate)`` per
op family, sped up on several threads for large kernels; this module measures those numbers
(about a second: a kernel dispatch, pointwise and copy bandwidth, layer norm, GEMMs at a few
sizes, the fused and packed linear kernels where this ATen build has them, attention, convolution,
GEMM speed per float dtype, and the speed-up of a large GEMM on the process's threads) and keeps
them in the per-machine figures file (`rewrite.cost.machine`), so only the first compile on a machine
pays for it. ``python -m rewrite calibrate`` measures again.

Rates are measured on one thread: a kernel on one thread is timed the same whatever else the
machine runs (only preemption adds time, and the fastest of many short batches is free of it:
`rewrite.cost.timing`), whereas a thread pool on a busy machine waits for its slowest thread, whole
scheduler quanta at a time. The multi-thread speed-up is measured once, on a large GEMM, and clamped
to [1, threads].

The process's calibration (`current`) is the one process cache of the cost model's figures: the
rates, and the kernel times measured at graphs' shapes (`rewrite.cost.kernel_times`), both read from
the figures file once, or measured and saved. A damaged, stale or old file is logged and measured again.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading

import torch

from ..ops import packed_linear_weight
from ..utils import THREAD_COUNT_LOCK, set_this_thread_intra_op_threads
from .kernel_times import KernelTimes
from .machine import SPEED, FiguresError, cache_path, read, update
from .rates import COMPUTE_FAMILIES, DEFAULT, FAMILIES, Calibration, Rate
from .timing import fastest

log = logging.getLogger("rewrite")

__all__ = ["current", "use", "calibrate", "measure", "load", "KERNEL_TIMES_ENV"]

KERNEL_TIMES_ENV = "REWRITE_KERNEL_TIMES"  # "0": no kernel measured at a graph's shapes, the rates alone


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
            wt = packed_linear_weight(w.t().contiguous())  # as generated code binds it
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
    speed = {d: min(max(dtype_times["float32"] / t, SPEED[0]), SPEED[1]) for d, t in dtype_times.items()}
    parallel = min(max(big_single / big_parallel, 1.0), float(threads)) if big_parallel else 1.0
    return Calibration(dispatch, view, families, speed, threads, parallel, "measured")


# -- the figures file's rates ---------------------------------------------------------------------------

def load(path: str) -> Calibration:
    """The rates in the figures file at ``path``; raises FiguresError naming the file and field when it is
    damaged, stale, of another format, or holds no rates yet (only kernel times)."""
    cal = read(path).calibration
    if cal is None:
        raise FiguresError(f"{path}: field calibration is null (not measured yet)")
    return cal


def _save(cal: Calibration, path: str) -> Calibration | None:
    """``cal`` written into the figures file at ``path`` (the file's kernel times kept), with the file as
    its source; None when the folder is not writable (the figures are then used for this process only)."""
    try:
        update(path, calibration=cal)
        return dataclasses.replace(cal, source=path)
    except OSError as e:
        log.warning("cost model: cannot write %s (%s); the calibration is kept for this process only", path, e)
        return None


def calibrate(folder: str | None = None, quick: bool = False) -> tuple[Calibration, str | None]:
    """Measure now and replace the rates in the figures file; returns the calibration and where it was
    saved (None when the folder is not writable: the figures are then used for this process only)."""
    cal = measure(quick=quick)
    path = cache_path(folder)
    saved = _save(cal, path)
    cal, path = (saved, path) if saved is not None else (cal, None)
    with _lock:
        _process["cal"] = _with_kernel_times(cal)
    return cal, path


# -- the process's calibration --------------------------------------------------------------------

class _State(threading.local):
    override: Calibration | None = None  # set by use() on this thread


_state = _State()
_lock = threading.Lock()
_process: dict = {}  # "cal" -> the calibration this process loaded or measured, with its kernel times


def current() -> Calibration:
    """This thread's `use` override, else the process's calibration: the figures file, or measured
    now (once per machine, torch version and thread count) and saved."""
    if _state.override is not None:
        return _state.override
    cal = _process.get("cal")
    if cal is not None and cal.threads == torch.get_num_threads():
        return cal
    with _lock:
        cal = _process.get("cal")
        if cal is None or cal.threads != torch.get_num_threads():
            cal = _process["cal"] = _load_or_measure()
    return cal


def _with_kernel_times(cal: Calibration, times: dict | None = None) -> Calibration:
    """``cal`` with this machine's measured kernel times (`rewrite.cost.kernel_times`: ``times`` as read
    from the figures file, else read now), unless ``REWRITE_KERNEL_TIMES=0`` asks for the rates alone."""
    if os.environ.get(KERNEL_TIMES_ENV) == "0":
        return cal
    return dataclasses.replace(cal, kernel_times=KernelTimes(cache_path(), times=times))


def _load_or_measure() -> Calibration:
    """The rates and kernel times of the figures file, read once; the rates measured and saved where the
    file has none (missing, damaged, stale, old, or holding kernel times alone)."""
    path = cache_path()
    times: dict = {}  # a missing or damaged file has none: not read again
    if os.path.lexists(path):
        try:
            figures = read(path)
            times = figures.kernel_times
            if figures.calibration is not None:
                return _with_kernel_times(figures.calibration, times)
            log.info("cost model: %s holds no rates yet", path)
        except FiguresError as e:
            log.warning("cost model cache: %s; measuring again", e)
    log.info("cost model: calibrating on this machine (once per machine, torch version and thread count)")
    try:
        cal = measure()
    except Exception as e:  # noqa: BLE001 - a failed benchmark must not fail a compile
        log.warning("cost model: calibration failed (%s: %s); using the default figures", type(e).__name__, e)
        return _with_kernel_times(dataclasses.replace(DEFAULT, threads=torch.get_num_threads()), times)
    return _with_kernel_times(_save(cal, path) or cal, times)


@contextlib.contextmanager
def use(cal: Calibration):
    """Make ``cal`` the calibration on this thread inside the block (tests, benchmarks, what-ifs)."""
    before = _state.override
    _state.override = cal
    try:
        yield cal
    finally:
        _state.override = before
